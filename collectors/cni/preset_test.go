package cni

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
)

// conflists of the CNIs with presets, as their installers write them (trimmed).
const (
	awsConflist = `{"cniVersion":"0.4.0","name":"aws-cni","plugins":[{"name":"aws-cni","type":"aws-cni"},` +
		`{"name":"egress-cni","type":"egress-cni"},{"type":"portmap","capabilities":{"portMappings":true}}]}`
	ciliumConflist  = `{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni","enable-debug":false}]}`
	calicoConflist  = `{"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[{"type":"calico","datastore_type":"kubernetes"},{"type":"bandwidth"},{"type":"portmap"}]}`
	chainedConflist = `{"cniVersion":"0.3.1","name":"aws-cni","plugins":[{"type":"aws-cni"},{"type":"egress-cni"},{"type":"portmap"},{"type":"cilium-cni"}]}`
	flannelConflist = `{"name":"cbr0","cniVersion":"0.3.1","plugins":[{"type":"flannel"},{"type":"portmap"}]}`
)

// cniHost writes a host root with one conflist and executable plugin binaries.
func cniHost(t testing.TB, conflist string, binaries ...string) string {
	t.Helper()
	root := t.TempDir()
	conf := filepath.Join(root, "etc/cni/net.d")
	bin := filepath.Join(root, "opt/cni/bin")
	for _, d := range []string{conf, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(conf, "10-net.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// grpcHealthHandler answers grpc.health.v1.Health/Check like grpc-go's health server,
// insisting on what a real gRPC server insists on.
func grpcHealthHandler(status byte, grpcStatus string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.ProtoMajor != 2 || r.Method != http.MethodPost || r.URL.Path != "/grpc.health.v1.Health/Check" ||
			r.Header.Get("Content-Type") != "application/grpc" || r.Header.Get("Te") != "trailers" ||
			!bytes.Equal(body, []byte{0, 0, 0, 0, 0}) {
			http.Error(w, "not a gRPC health check", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		w.WriteHeader(http.StatusOK)
		if grpcStatus == "0" {
			_, _ = w.Write([]byte{0, 0, 0, 0, 2, 0x08, status})
		}
		w.Header().Set("Grpc-Status", grpcStatus)
		if grpcStatus != "0" {
			w.Header().Set("Grpc-Message", "unknown service")
		}
	})
}

// serveH2C serves h over cleartext HTTP/2 on l until the test ends.
func serveH2C(t testing.TB, l net.Listener, h http.Handler) {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &p, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// unixSocket listens on <root>/var/run/aws-node/ipamd.sock.
func unixSocket(t testing.TB, root string) net.Listener {
	t.Helper()
	dir := filepath.Join(root, "var/run/aws-node")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "ipamd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// redirectClient sends every HTTP request to srv, whatever the URL's host: the presets'
// fixed agent ports become the test server. It records the URLs asked for.
func redirectClient(srv *httptest.Server, asked *[]string) *http.Client {
	addr := srv.Listener.Addr().String()
	return &http.Client{Transport: &recordingTransport{
		asked: asked,
		next: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}},
	}}
}

type recordingTransport struct {
	asked *[]string
	next  http.RoundTripper
}

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	*r.asked = append(*r.asked, req.URL.String()+" brief="+req.Header.Get("Brief"))
	return r.next.RoundTrip(req)
}

func TestPresetsHTTP(t *testing.T) {
	agentStatus := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz", "/readiness":
			w.WriteHeader(agentStatus)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)

	tests := []struct {
		name     string
		conflist string
		bins     []string
		preset   string
		agent    int
		status   collectors.Status
		reason   string
		asked    []string
		msg      string
	}{
		{
			name: "cilium detected, healthy", conflist: ciliumConflist, bins: []string{"cilium-cni"}, agent: 200,
			status: collectors.StatusHealthy, reason: ReasonCNIReady,
			asked: []string{"http://127.0.0.1:9879/healthz brief=true"},
			msg:   "cilium-agent http://127.0.0.1:9879/healthz returned 200 OK",
		},
		{
			name: "cilium detected, agent down", conflist: ciliumConflist, bins: []string{"cilium-cni"}, agent: 503,
			status: collectors.StatusUnhealthy, reason: ReasonCNIAgentUnhealthy,
			asked: []string{"http://127.0.0.1:9879/healthz brief=true"},
			msg:   "but the CNI agent is not healthy (detected from the plugin types): cilium-agent http://127.0.0.1:9879/healthz returned 503 Service Unavailable",
		},
		{
			name: "calico detected, felix not ready", conflist: calicoConflist, bins: []string{"calico", "bandwidth", "portmap"}, agent: 503,
			status: collectors.StatusUnhealthy, reason: ReasonCNIAgentUnhealthy,
			asked: []string{"http://localhost:9099/readiness brief="},
			msg:   "calico-node (Felix) http://localhost:9099/readiness returned 503",
		},
		{
			name: "unknown CNI: file checks only", conflist: flannelConflist, bins: []string{"flannel", "portmap"}, agent: 503,
			status: collectors.StatusHealthy, reason: ReasonCNIReady,
		},
		{
			name: "preset none", conflist: ciliumConflist, bins: []string{"cilium-cni"}, preset: PresetNone, agent: 503,
			status: collectors.StatusHealthy, reason: ReasonCNIReady,
		},
		{
			name: "explicit preset wins over detection", conflist: flannelConflist, bins: []string{"flannel", "portmap"}, preset: PresetCalico, agent: 200,
			status: collectors.StatusHealthy, reason: ReasonCNIReady,
			asked: []string{"http://localhost:9099/readiness brief="},
		},
		{
			name: "config problems come before the agent", conflist: ciliumConflist, agent: 200,
			status: collectors.StatusUnhealthy, reason: ReasonCNIPluginMissing,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agentStatus = tt.agent
			var asked []string
			c, err := New(Config{HostRoot: cniHost(t, tt.conflist, tt.bins...), Preset: tt.preset, HTTPClient: redirectClient(srv, &asked), Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			res := c.Check(context.Background())
			if res.Status != tt.status || res.Reason != tt.reason || !strings.Contains(res.Message, tt.msg) {
				t.Errorf("got %s/%s %q, want %s/%s containing %q", res.Status, res.Reason, res.Message, tt.status, tt.reason, tt.msg)
			}
			if strings.Join(asked, ";") != strings.Join(tt.asked, ";") {
				t.Errorf("asked %q, want %q", asked, tt.asked)
			}
		})
	}
}

func TestPresetAWSVPCCNI(t *testing.T) {
	bins := []string{"aws-cni", "egress-cni", "portmap"}
	tests := []struct {
		name    string
		setup   func(t *testing.T, root string, c *Collector)
		status  collectors.Status
		msg     string
		timeout time.Duration // 10s when zero
	}{
		{
			name: "v1.23+: unix socket SERVING",
			setup: func(t *testing.T, root string, _ *Collector) {
				serveH2C(t, unixSocket(t, root), grpcHealthHandler(1, "0"))
			},
			status: collectors.StatusHealthy,
			msg:    "aws-node (ipamd) gRPC health unix:///var/run/aws-node/ipamd.sock status SERVING",
		},
		{
			name: "v1.23+: NOT_SERVING",
			setup: func(t *testing.T, root string, _ *Collector) {
				serveH2C(t, unixSocket(t, root), grpcHealthHandler(2, "0"))
			},
			status: collectors.StatusUnhealthy,
			msg:    "but the CNI agent is not healthy (detected from the plugin types): aws-node (ipamd) gRPC health unix:///var/run/aws-node/ipamd.sock status NOT_SERVING",
		},
		{
			name: "stale socket left by a crashed ipamd",
			setup: func(t *testing.T, root string, _ *Collector) {
				l := unixSocket(t, root)
				l.(*net.UnixListener).SetUnlinkOnClose(false)
				_ = l.Close()
			},
			status: collectors.StatusUnhealthy,
			msg:    "connection refused",
		},
		{
			name: "gRPC error status",
			setup: func(t *testing.T, root string, _ *Collector) {
				serveH2C(t, unixSocket(t, root), grpcHealthHandler(0, "5"))
			},
			status: collectors.StatusUnhealthy,
			msg:    `grpc-status "5" unknown service`,
		},
		{
			name: "v1.22 and earlier: TCP 127.0.0.1:50051 when there is no socket",
			setup: func(t *testing.T, _ string, c *Collector) {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				serveH2C(t, l, grpcHealthHandler(1, "0"))
				c.dial = func(ctx context.Context, network, address string) (net.Conn, error) {
					if network != "tcp" || address != "127.0.0.1:50051" {
						t.Errorf("dialed %s %s, want tcp 127.0.0.1:50051", network, address)
					}
					return dialNet(ctx, "tcp", l.Addr().String())
				}
			},
			status: collectors.StatusHealthy,
			msg:    "aws-node (ipamd) gRPC health 127.0.0.1:50051 status SERVING",
		},
		{
			// No socket visible and the old port refuses: ipamd down, or v1.23+ with
			// /var/run/aws-node not mounted into the agent. Unknown, never a false Unhealthy.
			name: "no socket and the old port refuses",
			setup: func(t *testing.T, _ string, c *Collector) {
				c.dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
					l, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					addr := l.Addr().String()
					_ = l.Close()
					return dialNet(ctx, "tcp", addr)
				}
			},
			status: collectors.StatusUnknown,
			msg:    "cannot observe the CNI agent (detected from the plugin types): aws-node (ipamd) gRPC health 127.0.0.1:50051 connection refused; no ipamd socket",
		},
		{
			name: "old port answers NOT_SERVING",
			setup: func(t *testing.T, _ string, c *Collector) {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				serveH2C(t, l, grpcHealthHandler(2, "0"))
				c.dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
					return dialNet(ctx, "tcp", l.Addr().String())
				}
			},
			status: collectors.StatusUnhealthy,
			msg:    "127.0.0.1:50051 status NOT_SERVING",
		},
		{
			name: "hangs",
			setup: func(t *testing.T, root string, _ *Collector) {
				l := unixSocket(t, root)
				t.Cleanup(func() { _ = l.Close() })
				go func() { // accept and never answer
					for {
						conn, err := l.Accept()
						if err != nil {
							return
						}
						t.Cleanup(func() { _ = conn.Close() })
					}
				}()
			},
			status:  collectors.StatusUnhealthy,
			msg:     "did not answer within 300ms",
			timeout: 300 * time.Millisecond,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := cniHost(t, awsConflist, bins...)
			// Rows whose server answers get a timeout no loaded CI machine reaches (a -race
			// gRPC round trip took over 300 ms at load 40); only the hanging row waits it out.
			c, err := New(Config{HostRoot: root, Timeout: cmp.Or(tt.timeout, 10*time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			tt.setup(t, root, c)
			res := c.Check(context.Background())
			if res.Status != tt.status || !strings.Contains(res.Message, tt.msg) {
				t.Errorf("got %s/%s %q, want %s containing %q", res.Status, res.Reason, res.Message, tt.status, tt.msg)
			}
		})
	}
}

func TestPresetChainedProbesEveryAgent(t *testing.T) {
	root := cniHost(t, chainedConflist, "aws-cni", "egress-cni", "portmap", "cilium-cni")
	serveH2C(t, unixSocket(t, root), grpcHealthHandler(1, "0"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	t.Cleanup(srv.Close)
	var asked []string
	c, err := New(Config{HostRoot: root, HTTPClient: redirectClient(srv, &asked), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Check(context.Background())
	if len(res.Inputs) != 3 || res.Inputs[1].Source != "gRPC health unix:///var/run/aws-node/ipamd.sock" || res.Inputs[1].Value != "status SERVING" ||
		res.Inputs[1].Threshold != "SERVING" || res.Inputs[2].Source != "http://127.0.0.1:9879/healthz" || res.Inputs[2].Threshold != "2xx" {
		t.Errorf("Inputs = %+v", res.Inputs)
	}
	want := "cilium-agent http://127.0.0.1:9879/healthz returned 503 Service Unavailable"
	if res.Status != collectors.StatusUnhealthy || !strings.Contains(res.Message, want) || strings.Contains(res.Message, "NOT_SERVING") {
		t.Errorf("got %s %q, want Unhealthy naming only %q", res.Status, res.Message, want)
	}
}

func TestNewRejectsUnknownPreset(t *testing.T) {
	_, err := New(Config{Preset: "weave"})
	if err == nil || !strings.Contains(err.Error(), `Preset "weave" is not one of auto, none, aws-vpc-cni, cilium, calico`) {
		t.Fatalf("err = %v", err)
	}
}

func TestParseHealthCheckResponse(t *testing.T) {
	tests := []struct {
		in      []byte
		want    string
		wantErr bool
	}{
		{in: []byte{0, 0, 0, 0, 2, 0x08, 1}, want: "SERVING"},
		{in: []byte{0, 0, 0, 0, 2, 0x08, 2}, want: "NOT_SERVING"},
		{in: []byte{0, 0, 0, 0, 0}, want: "UNKNOWN"},
		{in: []byte{0, 0, 0, 0, 5, 0x12, 1, 'x', 0x08, 3}, want: "SERVICE_UNKNOWN"}, // unknown field skipped
		{in: []byte{0, 0, 0, 0, 2, 0x08, 9}, want: "status 9"},
		{in: []byte{0, 0, 0}, wantErr: true},
		{in: []byte{1, 0, 0, 0, 0}, wantErr: true},
		{in: []byte{0, 0, 0, 0, 3, 0x08, 1}, wantErr: true},
		{in: []byte{0, 0, 0, 0, 1, 0x08}, wantErr: true},
		{in: []byte{0, 0, 0, 0, 1, 0x0d}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseHealthCheckResponse(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseHealthCheckResponse(%v) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// BenchmarkCheckAWSPreset: file checks plus one gRPC health call to ipamd over its socket.
func BenchmarkCheckAWSPreset(b *testing.B) {
	root := cniHost(b, awsConflist, "aws-cni", "egress-cni", "portmap")
	serveH2C(b, unixSocket(b, root), grpcHealthHandler(1, "0"))
	c, err := New(Config{HostRoot: root})
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
}
