package kubelet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/fakeproc"
)

// BenchmarkCheck measures one kubelet check against a local /healthz with no bus socket
// (the verdict comes from /healthz alone; the missing socket is redialled only after backoff).
func BenchmarkCheck(b *testing.B) {
	hz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer hz.Close()
	c, err := New(Config{
		DBusAddress: "unix:path=" + filepath.Join(b.TempDir(), "no_bus_socket"),
		HealthzURL:  hz.URL + "/healthz",
		Logger:      discardLogger(),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if res := c.Check(ctx); res.Status != collectors.StatusHealthy {
			b.Fatalf("%s/%s: %s", res.Status, res.Reason, res.Message)
		}
	}
}

// BenchmarkCheckDBus measures one kubelet check with both observations: two GetAll calls
// over a real dbus-daemon to the fake systemd, and /healthz.
func BenchmarkCheckDBus(b *testing.B) {
	addr := startBus(b, filepath.Join(socketDir(b), "bus.sock"))
	startFakeSystemd(b, addr)
	hz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer hz.Close()
	c, err := New(Config{DBusAddress: addr, HealthzURL: hz.URL + "/healthz", Timeout: 5 * time.Second, Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if res := c.Check(ctx); res.Status != collectors.StatusHealthy {
			b.Fatalf("%s/%s: %s", res.Status, res.Reason, res.Message)
		}
	}
}

func BenchmarkParseRegisterWithTaints(b *testing.B) {
	const raw = "node.cilium.io/agent-not-ready=true:NoExecute,readiness.k8s.io/network=pending:NoSchedule,dedicated=db:NoSchedule"
	b.ReportAllocs()
	for b.Loop() {
		if taints, problems := ParseRegisterWithTaints(raw); len(taints) != 3 || len(problems) != 0 {
			b.Fatal(taints, problems)
		}
	}
}

// BenchmarkConfigCheck runs the flag check on: a running kubelet with config drop-ins
// (dropin-json); no kubelet process, so the command line is rebuilt from the AL2 unit, its
// drop-ins and the kubelet config file (from-unit); and dropin-json with a /proc the size of
// a busy EKS node's besides the kubelet (node-sized-proc: 150 kernel threads, 150 user
// processes, all below the kubelet's PID as on a node where it starts late in boot). The
// fixtures' own /proc has four entries, which hides what a scan of /proc costs.
func BenchmarkConfigCheck(b *testing.B) {
	nodeSized := b.TempDir()
	if err := fakeproc.NodeSizedCopy(nodeSized, filepath.Join("testdata", "hosts", "dropin-json")); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, root string }{
		{"dropin-json", filepath.Join("testdata", "hosts", "dropin-json")},
		{"from-unit", filepath.Join("testdata", "hosts", "al2-dropin-quoted-ok")},
		{"node-sized-proc", nodeSized},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := NewConfigCheck(ConfigCheckConfig{HostRoot: bc.root, ExpectedTaints: []string{ciliumTaint}})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if res := c.Check(ctx); res.Status != collectors.StatusHealthy {
					b.Fatal(res.Message)
				}
			}
		})
	}
}
