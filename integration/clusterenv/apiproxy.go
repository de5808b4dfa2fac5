package clusterenv

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APIProxy stands between one remediator and the API server, so a test decides what the
// remediator can reach: everything (up), nothing (down: connections refused, open watches cut),
// or everything but Leases (leasesDown: every Lease list and watch answered 503). The last is
// the state client-go leaves a process in after a long outage: its reflectors back off (up to
// 30 s, doubled by jitter) independently of each other and of direct calls, so Node writes and
// EC2 calls work again while the Lease cache is still what it was before the outage.
type APIProxy struct {
	t      testing.TB
	addr   string
	rp     *httputil.ReverseProxy
	token  string
	leases atomic.Bool // Lease requests refused
	// NodeWatches counts Node list/watch requests passed upstream since the last reset: the
	// remediator's Node informer is back.
	NodeWatches atomic.Int64

	mu  sync.Mutex
	srv *http.Server
}

// NewAPIProxy starts a proxy to upstream, up; it is closed when the test ends.
func NewAPIProxy(t testing.TB, upstream *rest.Config) *APIProxy {
	t.Helper()
	target, err := url.Parse(upstream.Host)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(upstream)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = tr
	rp.FlushInterval = -1 // watches stream
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		w.WriteHeader(http.StatusBadGateway)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &APIProxy{t: t, addr: l.Addr().String(), rp: rp, token: upstream.BearerToken}
	p.serve(l)
	t.Cleanup(func() { p.Down() })
	return p
}

func (p *APIProxy) serve(l net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(p.handle), ReadHeaderTimeout: 5 * time.Second}
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

func isLeaseRequest(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/apis/coordination.k8s.io/") && strings.Contains(r.URL.Path, "/leases")
}

func (p *APIProxy) handle(w http.ResponseWriter, r *http.Request) {
	if p.leases.Load() && isLeaseRequest(r) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"lease watch down (test)","reason":"ServiceUnavailable","code":503}`))
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes" {
		p.NodeWatches.Add(1)
	}
	p.rp.ServeHTTP(w, r)
}

// Down refuses every connection and cuts the open ones.
func (p *APIProxy) Down() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Up serves again on the same address; leasesDown says whether Lease requests stay refused.
func (p *APIProxy) Up(leasesDown bool) {
	p.t.Helper()
	p.leases.Store(leasesDown)
	p.mu.Lock()
	running := p.srv != nil
	p.mu.Unlock()
	if running {
		return
	}
	var l net.Listener
	err := errors.New("not tried")
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
		if l, err = net.Listen("tcp", p.addr); err != nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err != nil {
		p.t.Fatalf("proxy: listen on %s again: %v", p.addr, err)
	}
	p.serve(l)
}

// Kubeconfig writes a kubeconfig that reaches the API server through the proxy.
func (p *APIProxy) Kubeconfig() string {
	p.t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxy"] = &clientcmdapi.Cluster{Server: "http://" + p.addr}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: p.token}
	cfg.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "admin"}
	cfg.CurrentContext = "proxy"
	path := filepath.Join(p.t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// WaitNodeWatch waits until the remediator's Node informer has listed or watched Nodes through
// the proxy since NodeWatches was last reset.
func (p *APIProxy) WaitNodeWatch(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if p.NodeWatches.Load() > 0 {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}
