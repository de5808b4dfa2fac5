package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/agent"
	"github.com/nodevigil/nodevigil/agent/config"
	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/fakeproc"
)

// BenchmarkCheckCycle measures one full cycle of every check, as the agent runs it every
// check interval: memory (procfs PSI + meminfo), kubelet (healthz over loopback; no D-Bus
// here), CNI (conflist + plugin binaries) and the kubelet flag check, over a fixture host root:
// "healthy" as it is (one process in /proc), and "node-sized" with a node's 300 processes
// (fakeproc.AddNodeSized) besides the kubelet, where the flag check finds it.
// Besides ns/op it reports cpu-ns/op, the process's user+system CPU per cycle (getrusage,
// the stand-in kubelet's included), which a loaded machine inflates far less than ns/op.
func BenchmarkCheckCycle(b *testing.B) {
	kubelet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	defer kubelet.Close()
	nodeSized := b.TempDir()
	if err := fakeproc.NodeSizedCopy(nodeSized, filepath.Join("testdata", "hosts", "healthy")); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, root string }{
		{"healthy", filepath.Join("testdata", "hosts", "healthy")},
		{"node-sized", nodeSized},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg, code := loadConfig(config.ModeCheck, []string{"--host-root", bc.root, "--kubelet-healthz-url", kubelet.URL + "/healthz"}, io.Discard)
			if cfg == nil {
				b.Fatalf("config: exit %d", code)
			}
			// The AWS event checks are off: `check` reads the metadata service in every cycle, the
			// running agent never does (its checks return what the watcher read last, a map lookup),
			// and 169.254.169.254 answers whatever the machine's network says (a 403 on some CI hosts).
			cfg.IMDS.Disabled = true
			checks, closeAll, err := buildChecks(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			defer closeAll()
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				results := agent.RunOnce(ctx, checks, 5*time.Second, slog.New(slog.DiscardHandler))
				for _, r := range results {
					if r.Status == "" || r.Status == collectors.StatusUnknown && r.Check != "kubelet-config" {
						b.Fatalf("%s: %s %s: %s", r.Check, r.Status, r.Reason, r.Message)
					}
				}
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the process's user+system CPU so far, in nanoseconds.
func cpuTime(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
