package controlplane

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/integration/testbin"
)

// TestStartAgainWhenAPortIsTaken: etcd is handed a port that another process took between
// pickPorts and etcd's bind, and that process answers etcd's health probe as etcd would. The
// harness must neither take it for its etcd nor give up: it starts etcd again on fresh ports,
// and the etcd it reports is the one holding its port.
func TestStartAgainWhenAPortIsTaken(t *testing.T) {
	var probed atomic.Int32
	impostor := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		probed.Add(1)
		_, _ = io.WriteString(w, `{"health":"true","reason":""}`)
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = impostor.Serve(l) }()
	t.Cleanup(func() { _ = impostor.Close() })
	taken := l.Addr().(*net.TCPAddr).Port

	var mu sync.Mutex
	calls := 0
	pickPorts = func(n int) ([]int, error) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		ports, err := freePorts(n)
		if first && err == nil {
			ports[0] = taken
		}
		return ports, err
	}
	t.Cleanup(func() { pickPorts = freePorts })

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	bins, err := FindOrBuild(ctx, BuildConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	c := &ControlPlane{cfg: Config{Binaries: bins, Progress: &progress, Dir: t.TempDir()}, dir: ""}
	c.cfg.defaults()
	c.dir = c.cfg.Dir
	if err := c.writeFiles(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	if err := c.startEtcd(ctx); err != nil {
		t.Fatalf("start etcd: %v\nprogress:\n%s", err, progress.String())
	}
	var client string
	for i, a := range c.etcd.args {
		if a == "--listen-client-urls" {
			client = c.etcd.args[i+1]
		}
	}
	if strings.HasSuffix(client, ":"+strconv.Itoa(taken)) {
		t.Fatalf("etcd reported on the taken port %d (the impostor answered %d probes)", taken, probed.Load())
	}
	port, _ := strconv.Atoi(client[strings.LastIndexByte(client, ':')+1:])
	if ok, err := testbin.Listening(c.etcd.pid(), port); !ok || err != nil {
		t.Errorf("etcd (pid %d) does not hold %s: %v, %v", c.etcd.pid(), client, ok, err)
	}
	if calls != 2 || !strings.Contains(progress.String(), "starting it again on fresh ports") {
		t.Errorf("%d port picks, want 2; progress:\n%s", calls, progress.String())
	}
}
