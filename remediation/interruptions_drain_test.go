package remediation

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// stepAlive steps the fake clock and renews the node's Leases, so it stays healthy.
func stepAlive(h *harness, d time.Duration, names ...string) {
	h.clock.Step(d)
	for _, n := range names {
		h.renew(DefaultKubeletLeaseNamespace, n, h.clock.Now())
		h.renew(h.c.rc.AgentNamespace, n, h.clock.Now())
	}
}

func evictions(h *harness) []string {
	var out []string
	for _, s := range h.Steps() {
		if ref, ok := strings.CutPrefix(s, "evict "); ok {
			out = append(out, ref)
		}
	}
	return out
}

// TestInterruptionDrainEvictsDoNotDisruptLast: on a spot notice (deadline two minutes out), pods
// annotated do-not-disrupt are evicted only after every other pod has left (EvictLast), at the
// latest their grace period before the deadline when another pod is held by a PDB, and never
// with doNotDisruptPods Keep; at the deadline an Event says what is left and what happens.
func TestInterruptionDrainEvictsDoNotDisruptLast(t *testing.T) {
	dnd := func(p *corev1.Pod) { p.Annotations[decide.AnnotationDoNotDisrupt] = "true" }
	for _, tc := range []struct {
		name     string
		policy   string
		pdbHeld  bool // web-2's eviction is refused throughout
		want     []string
		events   []string
		noEvents []string
	}{
		{name: "evict last", policy: "", want: []string{"app/web-1", "app/web-2", "app/db"},
			events: []string{EventInterruptionEvictingDND, EventInterruptionDrained}, noEvents: []string{EventInterruptionDeadline}},
		{name: "keep", policy: "  interruptions: {doNotDisruptPods: Keep}\n", want: []string{"app/web-1", "app/web-2"},
			events: []string{EventInterruptionDrained}, noEvents: []string{EventInterruptionEvictingDND}},
		{name: "deadline", policy: "", pdbHeld: true, want: []string{"app/web-1", "app/db"},
			events: []string{EventInterruptionEvictingDND, EventInterruptionDeadline}, noEvents: []string{EventInterruptionDrained}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, interruptionPolicies+tc.policy))
			h.healthy(newNode("g1", inPool("general"), spotNotice()))
			h.spot("g1")
			h.add(newPod("app", "web-1", "g1"), newPod("app", "web-2", "g1"), newPod("app", "db", "g1", dnd))
			h.grace["app/web-1"], h.grace["app/web-2"], h.grace["app/db"] = true, true, true
			if tc.pdbHeld {
				h.pdb["app/web-2"] = true
			}
			// Every 5 s until past the spot deadline (t0 + 2m).
			for range 30 {
				if _, err := h.sync("g1"); err != nil {
					t.Fatal(err)
				}
				if got := evictions(h); len(got) > 0 && got[len(got)-1] == "app/db" && len(got) < len(tc.want) {
					t.Fatalf("db evicted before the others: %v", got)
				}
				stepAlive(h, 5*time.Second, "g1")
			}
			got := evictions(h)
			// The plain pods in any order, the annotated one last.
			if i := slices.Index(got, "app/db"); i >= 0 && i != len(got)-1 {
				t.Errorf("db evicted before %v", got[i+1:])
			}
			slices.Sort(got[:len(got)-min(1, len(got))])
			if !slices.Contains(tc.want, "app/db") {
				slices.Sort(got)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("evictions %v, want %v in that order", got, tc.want)
			}
			evs := h.events()
			for _, r := range tc.events {
				if !hasEvent(evs, r) {
					t.Errorf("no %s event: %v", r, evs)
				}
			}
			for _, r := range tc.noEvents {
				if hasEvent(evs, r) {
					t.Errorf("unexpected %s event: %v", r, evs)
				}
			}
		})
	}
}
