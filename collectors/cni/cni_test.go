package cni

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func fixedNow() time.Time { return t0 }

func TestCheckFixtures(t *testing.T) {
	tests := []struct {
		host   string
		status collectors.Status
		reason string
		msg    []string
	}{
		{
			host: "valid", status: collectors.StatusHealthy, reason: ReasonCNIReady,
			msg: []string{`/etc/cni/net.d/10-aws.conflist: network "aws-cni" (cniVersion 0.4.0), plugins aws-cni, egress-cni, portmap present in /opt/cni/bin`},
		},
		{
			host: "single-conf", status: collectors.StatusHealthy, reason: ReasonCNIReady,
			msg: []string{`10-bridge.conf: network "bridge-net" (cniVersion 1.0.0), plugins bridge present`},
		},
		{
			host: "json-ext", status: collectors.StatusHealthy, reason: ReasonCNIReady,
			msg: []string{`10-flannel.json: network "cbr0"`, "plugins flannel present"},
		},
		{
			host: "plugin-dir", status: collectors.StatusHealthy, reason: ReasonCNIReady,
			msg: []string{`network "mynet" (cniVersion 1.1.0), plugins bridge, portmap present`},
		},
		{
			host: "lexical", status: collectors.StatusHealthy, reason: ReasonCNIReady,
			msg: []string{`/etc/cni/net.d/05-cilium.conflist: network "cilium"`},
		},
		{
			host: "lexical-first-invalid", status: collectors.StatusUnhealthy, reason: ReasonInvalidCNIConfig,
			msg: []string{`/etc/cni/net.d/00-broken.conf: invalid CNI config: missing "type"`},
		},
		{
			host: "missing-binary", status: collectors.StatusUnhealthy, reason: ReasonCNIPluginMissing,
			msg: []string{`/etc/cni/net.d/10-aws.conflist (network "aws-cni")`, `plugin "egress-cni" missing from /opt/cni/bin; plugin "portmap" missing from /opt/cni/bin`},
		},
		{
			host: "not-executable", status: collectors.StatusUnhealthy, reason: ReasonCNIPluginMissing,
			msg: []string{`plugin "portmap" in /opt/cni/bin is not executable (mode -rw-r--r--)`},
		},
		{
			host: "invalid-json", status: collectors.StatusUnhealthy, reason: ReasonInvalidCNIConfig,
			msg: []string{"/etc/cni/net.d/10-aws.conflist: invalid CNI config: not valid JSON"},
		},
		{
			host: "empty-plugins", status: collectors.StatusUnhealthy, reason: ReasonInvalidCNIConfig,
			msg: []string{`10-empty.conflist: invalid CNI config: empty "plugins" list`},
		},
		{
			host: "conflist-as-conf", status: collectors.StatusUnhealthy, reason: ReasonInvalidCNIConfig,
			msg: []string{`10-aws.conf: invalid CNI config: missing "type" (a "plugins" list belongs in a .conflist file)`},
		},
		{
			host: "no-version", status: collectors.StatusUnhealthy, reason: ReasonInvalidCNIConfig,
			msg: []string{`missing "cniVersion"`},
		},
		{
			host: "plugin-dir-missing", status: collectors.StatusUnhealthy, reason: ReasonInvalidCNIConfig,
			msg: []string{`no "plugins" list and no plugin directory /etc/cni/net.d/mynet`},
		},
		{
			host: "empty", status: collectors.StatusUnhealthy, reason: ReasonNoCNIConfig,
			msg: []string{"no CNI network config (*.conf, *.conflist, *.json) in /etc/cni/net.d"},
		},
		{
			host: "no-conf-dir", status: collectors.StatusUnhealthy, reason: ReasonNoCNIConfig,
			msg: []string{"/etc/cni/net.d (directory missing)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			c, err := New(Config{HostRoot: filepath.Join("testdata", "hosts", tt.host), Preset: PresetNone, Now: fixedNow})
			if err != nil {
				t.Fatal(err)
			}
			res := c.Check(context.Background())
			if res.Check != "cni" || c.Name() != "cni" {
				t.Errorf("check name %q / %q, want cni", res.Check, c.Name())
			}
			if !res.Time.Equal(t0) {
				t.Errorf("time %v, want the configured clock's %v", res.Time, t0)
			}
			if res.Status != tt.status || res.Reason != tt.reason {
				t.Errorf("got %s/%s (%s), want %s/%s", res.Status, res.Reason, res.Message, tt.status, tt.reason)
			}
			if res.Err != nil {
				t.Errorf("observed a problem, yet Err = %v", res.Err)
			}
			for _, s := range tt.msg {
				if !strings.Contains(res.Message, s) {
					t.Errorf("message %q does not contain %q", res.Message, s)
				}
			}
		})
	}
}

func mustWrite(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // WriteFile's mode is masked by the umask
		t.Fatal(err)
	}
}

const portmapList = `{"cniVersion":"1.0.0","name":"%s","plugins":[{"type":"portmap"}]}`

func TestLexicalOrderIsByteWise(t *testing.T) {
	// Upper-case sorts before lower-case, and "10-b" before "9-a": libcni sorts strings, not
	// numbers or case-folded names.
	root := t.TempDir()
	conf := filepath.Join(root, "etc/cni/net.d")
	for _, n := range []string{"9-a.conflist", "10-b.conflist", "10-B.conflist"} {
		mustWrite(t, filepath.Join(conf, n), strings.Replace(portmapList, "%s", n, 1), 0o644)
	}
	mustWrite(t, filepath.Join(root, "opt/cni/bin/portmap"), "#!/bin/sh\n", 0o755)
	c, err := New(Config{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Check(context.Background())
	if res.Status != collectors.StatusHealthy || !strings.Contains(res.Message, `10-B.conflist: network "10-B.conflist"`) {
		t.Errorf("got %s %q, want healthy from 10-B.conflist", res.Status, res.Message)
	}
}

func TestSymlinksResolveInsideHostRoot(t *testing.T) {
	// On the host: /opt/cni/bin -> /usr/libexec/cni (absolute), and the config is an
	// absolute symlink into /var/lib. Both must resolve under HostRoot, not in the agent's
	// own filesystem.
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "usr/libexec/cni/portmap"), "#!/bin/sh\n", 0o755)
	mustWrite(t, filepath.Join(root, "var/lib/cni/10-net.conflist"), strings.Replace(portmapList, "%s", "linked", 1), 0o644)
	if err := os.MkdirAll(filepath.Join(root, "opt/cni"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/cni/net.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"opt/cni/bin":                   "/usr/libexec/cni",
		"etc/cni/net.d/10-net.conflist": "../../../var/lib/../lib/cni/10-net.conflist",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Config{HostRoot: root, ConfDir: "/etc/cni/net.d"})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Check(context.Background())
	if res.Status != collectors.StatusHealthy {
		t.Errorf("got %s/%s %q, want healthy through the symlinks", res.Status, res.Reason, res.Message)
	}

	// A symlink loop is reported, not followed forever.
	if err := os.Remove(filepath.Join(root, "usr/libexec/cni/portmap")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/cni/bin/portmap", filepath.Join(root, "usr/libexec/cni/portmap")); err != nil {
		t.Fatal(err)
	}
	res = c.Check(context.Background())
	if res.Status != collectors.StatusUnknown || res.Reason != ReasonCNIUnreadable || res.Err == nil {
		t.Errorf("loop: got %s/%s err=%v, want Unknown/%s with Err", res.Status, res.Reason, res.Err, ReasonCNIUnreadable)
	}
}

func TestResolveInRoot(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "a/b/file"), "x", 0o644)
	if err := os.Symlink("/a", filepath.Join(root, "abs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../a/b", filepath.Join(root, "a/up")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, want string
		missing    bool
	}{
		{name: "a/b/file", want: "a/b/file"},
		{name: "/abs/b/file", want: "a/b/file"},
		{name: "a/up/file", want: "a/b/file"},
		{name: "../../a/./b//file", want: "a/b/file"},
		{name: "a/b/file/x", missing: true},
		{name: "a/nope", missing: true},
	} {
		got, err := resolveInRoot(root, tt.name)
		if tt.missing {
			if !isMissing(err) {
				t.Errorf("resolveInRoot(%q) err = %v, want missing", tt.name, err)
			}
			continue
		}
		if err != nil || got != filepath.Join(root, tt.want) {
			t.Errorf("resolveInRoot(%q) = %q, %v; want %q", tt.name, got, err, filepath.Join(root, tt.want))
		}
	}
}

func TestUnreadableConfig(t *testing.T) {
	if os.Geteuid() == 0 {
		// Root reads through permission bits; use a config that is a dangling symlink's
		// directory instead: a matching name that cannot be opened as a file.
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "etc/cni/net.d/sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("sub", filepath.Join(root, "etc/cni/net.d/00-dir.conflist")); err != nil {
			t.Fatal(err)
		}
		c, err := New(Config{HostRoot: root})
		if err != nil {
			t.Fatal(err)
		}
		res := c.Check(context.Background())
		if res.Status != collectors.StatusUnknown || res.Reason != ReasonCNIUnreadable || res.Err == nil ||
			!strings.Contains(res.Message, "/etc/cni/net.d/00-dir.conflist") {
			t.Errorf("got %s/%s err=%v %q, want Unknown/%s naming the file", res.Status, res.Reason, res.Err, res.Message, ReasonCNIUnreadable)
		}
		return
	}
	root := t.TempDir()
	p := filepath.Join(root, "etc/cni/net.d/10-x.conflist")
	mustWrite(t, p, "{}", 0o000)
	c, err := New(Config{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Check(context.Background())
	if res.Status != collectors.StatusUnknown || res.Reason != ReasonCNIUnreadable || !errors.Is(res.Err, os.ErrPermission) {
		t.Errorf("got %s/%s err=%v, want Unknown/%s with a permission error", res.Status, res.Reason, res.Err, ReasonCNIUnreadable)
	}
}

func TestConfigTooLarge(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "etc/cni/net.d/10-big.conflist"), strings.Repeat(" ", maxConfigSize+1), 0o644)
	c, err := New(Config{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Check(context.Background())
	if res.Status != collectors.StatusUnhealthy || res.Reason != ReasonInvalidCNIConfig || !strings.Contains(res.Message, "larger than") {
		t.Errorf("got %s/%s %q, want Unhealthy/%s about the size", res.Status, res.Reason, res.Message, ReasonInvalidCNIConfig)
	}
}

func TestHealthEndpoint(t *testing.T) {
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/fail", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/hang", func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close: unblock hung handlers

	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	// Only the hanging row waits its timeout out; the others get one no loaded CI machine
	// reaches, so that a slow answer is not mistaken for none.
	const hangTimeout = 300 * time.Millisecond
	tests := []struct {
		name   string
		url    string
		status collectors.Status
		reason string
		msg    string
	}{
		{name: "2xx", url: srv.URL + "/ok", status: collectors.StatusHealthy, reason: ReasonCNIReady, msg: "/ok returned 200"},
		{name: "503", url: srv.URL + "/fail", status: collectors.StatusUnhealthy, reason: ReasonCNIAgentUnhealthy, msg: "/fail returned 503 Service Unavailable"},
		{name: "hangs", url: srv.URL + "/hang", status: collectors.StatusUnhealthy, reason: ReasonCNIAgentUnhealthy, msg: "/hang did not answer within 300ms"},
		{name: "refused", url: closedURL + "/healthz", status: collectors.StatusUnhealthy, reason: ReasonCNIAgentUnhealthy, msg: "connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timeout := 10 * time.Second
			if tt.name == "hangs" {
				timeout = hangTimeout
			}
			c, err := New(Config{HostRoot: "testdata/hosts/valid", HealthURL: tt.url, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res := c.Check(context.Background())
			// Generous bound: the point is that a hanging endpoint cannot hold the check.
			if elapsed := time.Since(start); elapsed > timeout+2*time.Second {
				t.Errorf("check took %v with a %v timeout", elapsed, timeout)
			}
			if res.Status != tt.status || res.Reason != tt.reason || !strings.Contains(res.Message, tt.msg) {
				t.Errorf("got %s/%s %q, want %s/%s containing %q", res.Status, res.Reason, res.Message, tt.status, tt.reason, tt.msg)
			}
		})
	}

	t.Run("config problems come before the health endpoint", func(t *testing.T) {
		c, err := New(Config{HostRoot: "testdata/hosts/missing-binary", HealthURL: srv.URL + "/ok"})
		if err != nil {
			t.Fatal(err)
		}
		if res := c.Check(context.Background()); res.Reason != ReasonCNIPluginMissing {
			t.Errorf("got %s, want %s", res.Reason, ReasonCNIPluginMissing)
		}
	})

	t.Run("caller cancels during the request", func(t *testing.T) {
		c, err := New(Config{HostRoot: "testdata/hosts/valid", HealthURL: srv.URL + "/hang", Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		res := c.Check(ctx)
		if res.Status != collectors.StatusUnknown || res.Reason != ReasonCheckCanceled || !errors.Is(res.Err, context.DeadlineExceeded) {
			t.Errorf("got %s/%s err=%v, want Unknown/%s", res.Status, res.Reason, res.Err, ReasonCheckCanceled)
		}
	})
}

func TestCheckCanceledBeforeStart(t *testing.T) {
	c, err := New(Config{HostRoot: "testdata/hosts/valid"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res := c.Check(ctx); res.Status != collectors.StatusUnknown || res.Reason != ReasonCheckCanceled || res.Err == nil {
		t.Errorf("got %s/%s err=%v, want Unknown/%s", res.Status, res.Reason, res.Err, ReasonCheckCanceled)
	}
}

func TestNewValidation(t *testing.T) {
	for _, tt := range []struct {
		name  string
		cfg   Config
		field string
	}{
		{name: "zero config", cfg: Config{}},
		{name: "relative health URL", cfg: Config{HealthURL: "127.0.0.1:9879/healthz"}, field: "HealthURL"},
		{name: "unix scheme", cfg: Config{HealthURL: "unix:///run/cilium.sock"}, field: "HealthURL"},
		{name: "negative timeout", cfg: Config{Timeout: -time.Second}, field: "Timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			switch {
			case tt.field == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.field != "" && (err == nil || !strings.Contains(err.Error(), tt.field)):
				t.Errorf("error %v, want one naming %q", err, tt.field)
			}
		})
	}
}

func TestCleanRel(t *testing.T) {
	for in, want := range map[string]string{
		"": DefaultConfDir, "/etc/cni/net.d": "etc/cni/net.d", "etc/cni/net.d/": "etc/cni/net.d", "../../x": "x",
	} {
		if got := cleanRel(in, DefaultConfDir); got != want {
			t.Errorf("cleanRel(%q) = %q, want %q", in, got, want)
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	c, err := New(Config{HostRoot: "testdata/hosts/valid", Preset: PresetNone})
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
