package fleet

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodevigil/nodevigil/remediation/config"
)

// TestRemediatorConfigParses: the config make run and the scenarios hand the remediator passes
// its strict validation, and says what the docs and make run's instructions promise: general
// acts on AWS events with the defaults, kafka only reports them.
func TestRemediatorConfigParses(t *testing.T) {
	for _, id := range []string{"fleet", "s001"} {
		t.Run(id, func(t *testing.T) {
			text := RemediatorConfig(Config{ID: id, AgentNamespace: "ns", AgentLeaseDuration: 10 * time.Second}, DevTimings)
			cfg, err := config.Parse([]byte(text))
			if err != nil {
				t.Fatalf("%v\n%s", err, text)
			}
			want := map[string]config.InterruptionAction{"general": config.InterruptionDrain, "kafka": config.InterruptionNotify}
			for _, p := range cfg.Policies {
				w, ok := want[p.Name]
				if !ok {
					continue
				}
				if got := p.Interruptions.SpotInterruption; got != w {
					t.Errorf("policy %s: spotInterruption %s, want %s", p.Name, got, w)
				}
				delete(want, p.Name)
			}
			if len(want) != 0 {
				t.Errorf("policies missing: %v", want)
			}
			// make run's fleet includes the developer's own node; a scenario's remediator sees
			// only its own pools.
			own := labels.Set{DefaultPoolLabel: id + "-general"}
			if id == "fleet" {
				own = labels.Set{DefaultPoolLabel: "general"}
			}
			if !cfg.Scope.Matches(own) {
				t.Errorf("scope %q leaves out the fleet's own general pool", cfg.NodeSelector)
			}
			if other := (labels.Set{DefaultPoolLabel: "other-general"}); cfg.Scope.Matches(other) != (id == "fleet") {
				t.Errorf("scope %q: another fleet's node in scope = %v, want %v", cfg.NodeSelector, cfg.Scope.Matches(other), id == "fleet")
			}
		})
	}
}
