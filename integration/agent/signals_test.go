package agent_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// writeAtomic replaces a host-root file in one rename, as the kernel's procfs never shows a
// half-written file, so the running agent never reads a torn fixture.
func writeAtomic(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, data, 0o644)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestMemoryPressureSurvivesAgentRestart swaps the host root's /proc fixtures at run time to
// put the node under memory pressure (PSI full stalls while MemAvailable is low), then
// restarts the agent during the pressure: MemoryHealthy stays False and keeps its original
// lastTransitionTime (the agent seeds its hysteresis from the condition).
func TestMemoryPressureSurvivesAgentRestart(t *testing.T) {
	n := newNode(t, true)
	cfgFile := filepath.Join(t.TempDir(), "agent.yaml")
	writeFile(t, cfgFile, "apiVersion: nodevigil.io/v1alpha1\nkind: AgentConfig\nmemory:\n  enterAfter: 2s\n  exitAfter: 30s\n", 0o644)
	n.extraArgs = []string{"--config", cfgFile}
	n.start()
	n.waitFor("MemoryHealthy=True", 30*time.Second, hasStatus("MemoryHealthy", corev1.ConditionTrue))

	// PSI alone on a roomy node: a container at its own limit, not node pressure.
	writeAtomic(t, filepath.Join(n.hostRoot, "proc/pressure/memory"),
		"some avg10=70.00 avg60=60.00 avg300=20.00 total=1\nfull avg10=45.00 avg60=40.00 avg300=10.00 total=1\n")
	time.Sleep(4 * time.Second) // two enterAfter periods; the verdict must not change
	obj, err := n.get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if c := condition(obj, "MemoryHealthy"); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("PSI alone with 75%% memory available marked the node: %+v", c)
	}

	// Now memory runs low too: pressure.
	writeAtomic(t, filepath.Join(n.hostRoot, "proc/meminfo"),
		"MemTotal:       8000000 kB\nMemFree:         200000 kB\nMemAvailable:    480000 kB\n")
	obj = n.waitFor("MemoryHealthy=False", 30*time.Second, hasStatus("MemoryHealthy", corev1.ConditionFalse))
	before := condition(obj, "MemoryHealthy")
	if before.Reason != "MemoryPressure" {
		t.Errorf("reason %q, want MemoryPressure", before.Reason)
	}

	if err := n.agent.Stop(10 * time.Second); err != nil {
		t.Fatalf("stop agent: %v", err)
	}
	time.Sleep(1100 * time.Millisecond) // transition times have second precision
	n.start()
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		resp, err := http.Get(n.metrics + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("restarted agent never became ready: %v\n%s", err, n.agent.LogTail(30))
	}
	time.Sleep(3 * time.Second) // more than enterAfter: an unseeded agent would have flipped to True
	obj, err = n.get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	after := condition(obj, "MemoryHealthy")
	if after == nil || after.Status != corev1.ConditionFalse {
		t.Fatalf("MemoryHealthy after an agent restart during pressure = %+v, want False", after)
	}
	if !after.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Errorf("lastTransitionTime moved across the restart: %v -> %v", before.LastTransitionTime, after.LastTransitionTime)
	}
}
