package install_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/testbin"
	"github.com/nodevigil/nodevigil/remediation/metricsauth"
)

// TestRemediatorMetricsAuth serves the remediator's handler chain as --metrics-secure does
// (TLS with a self-signed certificate, metricsauth.Handler) with the API client of the
// remediator's ServiceAccount, so its installed RBAC must allow the TokenReviews and
// SubjectAccessReviews. Scrapers are real ServiceAccount tokens: one bound to the chart's
// metrics-reader ClusterRole gets 200, one without the binding 403, no token and a made-up
// token 401, plain HTTP no metrics; the probes answer without a token.
func TestRemediatorMetricsAuth(t *testing.T) {
	ensureInstalled(t)
	ctx := t.Context()
	admin := adminClient(t)
	ns := uniq("scrapers")
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	remediator := saClient(ctx, t, namespace, remediatorSA, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "nodevigil_remediator_is_leader 1\n") })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	tlsCfg, err := metricsauth.TLSConfig("", "", []string{"localhost"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: metricsauth.Handler(remediator, slog.New(slog.DiscardHandler), mux), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(tls.NewListener(ln, tlsCfg)) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()

	cfgAllowed, err := cp.ServiceAccountConfig(ctx, ns, "prometheus", controlplane.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfgDenied, err := cp.ServiceAccountConfig(ctx, ns, "stranger", controlplane.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "nodevigil-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "prometheus"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), ns+"-metrics", metav1.DeleteOptions{})
	})

	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(scheme, path, token string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := insecure.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	cases := []struct {
		name, scheme, path, token string
		want                      int
	}{
		{"bound ServiceAccount", "https", "/metrics", cfgAllowed.BearerToken, http.StatusOK},
		{"ServiceAccount without the binding", "https", "/metrics", cfgDenied.BearerToken, http.StatusForbidden},
		{"no token", "https", "/metrics", "", http.StatusUnauthorized},
		{"token the API server never issued", "https", "/metrics", "not-a-token", http.StatusUnauthorized},
		{"liveness probe without a token", "https", "/healthz", "", http.StatusOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var code int
			var body string
			// RBAC bindings reach the authorizer's cache a moment after they are created.
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
				code, body = get(c.scheme, c.path, c.token)
				return code == c.want, nil
			})
			if err != nil {
				t.Fatalf("GET %s %s: %d %q, want %d", c.scheme, c.path, code, body, c.want)
			}
			if c.want == http.StatusOK && c.path == "/metrics" && !strings.Contains(body, "nodevigil_remediator_is_leader") {
				t.Errorf("200 without the metrics: %q", body)
			}
		})
	}

	// Plain HTTP, even with a good token, gets no metrics.
	code, body := get("http", "/metrics", cfgAllowed.BearerToken)
	if code == http.StatusOK || strings.Contains(body, "nodevigil_remediator") {
		t.Errorf("plain HTTP got %d %q, want a refusal", code, body)
	}
}

var (
	remediatorOnce sync.Once
	remediatorBin  string
	remediatorErr  error
)

// remediatorBinary builds nodevigil-remediator (with the race detector, as the other
// end-to-end tests run it) once per test binary.
func remediatorBinary(t *testing.T) string {
	t.Helper()
	remediatorOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nodevigil-install-remediator-")
		if err != nil {
			remediatorErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		remediatorBin, remediatorErr = testbin.Build(ctx, "github.com/nodevigil/nodevigil/remediation/cmd/nodevigil-remediator", dir, true)
	})
	if remediatorErr != nil {
		t.Fatal(remediatorErr)
	}
	return remediatorBin
}

// TestRemediatorBinaryServesSecureMetrics runs the real nodevigil-remediator binary with the
// shipped default --metrics-secure (not the handler chain in process), authenticated to the
// real API server as the installed remediator ServiceAccount, so the chart's RBAC for
// TokenReviews and SubjectAccessReviews is what the binary's reviews run under. A scraper
// ServiceAccount bound to nodevigil-metrics-reader gets the remediator's metrics (200); one
// without the binding gets 403, no token 401, plain HTTP nothing; /healthz needs no token.
func TestRemediatorBinaryServesSecureMetrics(t *testing.T) {
	ensureInstalled(t)
	bin := remediatorBinary(t)
	ctx := t.Context()
	admin := adminClient(t)
	ns := uniq("scrapers")
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	// The remediator's own identity: a token of the installed ServiceAccount, in a kubeconfig.
	saCfg, err := cp.ServiceAccountConfig(ctx, namespace, remediatorSA, controlplane.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: saCfg.Host, CertificateAuthorityData: saCfg.CAData}
	kc.AuthInfos["remediator"] = &clientcmdapi.AuthInfo{Token: saCfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "remediator"}
	kc.CurrentContext = "c"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	// No --metrics-secure flag: the default must be the secure server. Dry-run (the built-in
	// configuration) never calls EC2; the endpoint and credentials only keep the SDK off IMDS.
	p, err := testbin.Start("nodevigil-remediator", bin, []string{
		"--kubeconfig", kubeconfig,
		"--namespace", namespace,
		"--listen-address", "127.0.0.1:0", // the port it binds is read back: no other process can take it first
		"--ec2-endpoint", "http://127.0.0.1:1",
		"--aws-region", "us-east-1",
		"--log-format", "text",
	}, "POD_NAME=install-test-remediator", "AWS_ACCESS_KEY_ID=itest", "AWS_SECRET_ACCESS_KEY=itest", "AWS_EC2_METADATA_DISABLED=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("remediator did not stop cleanly: %v", err)
		}
		if t.Failed() {
			t.Logf("remediator log:\n%s", p.LogTail(80))
		}
	})
	listenCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	addr, err := p.ListenAddr(listenCtx)
	if err != nil {
		t.Fatal(err)
	}

	cfgAllowed, err := cp.ServiceAccountConfig(ctx, ns, "prometheus", controlplane.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfgDenied, err := cp.ServiceAccountConfig(ctx, ns, "stranger", controlplane.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "nodevigil-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "prometheus"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), ns+"-metrics", metav1.DeleteOptions{})
	})

	// The certificate is self-signed at start, so the scraper skips verification as a
	// Prometheus with insecure_skip_verify would; what is tested is who may read.
	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(scheme, path, token string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := insecure.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// Up: the probe answers over TLS without a token.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		if exited, perr := p.Exited(); exited {
			return false, fmt.Errorf("remediator exited: %v", perr)
		}
		code, _ := get("https", "/healthz", "")
		return code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("remediator /healthz over TLS never answered 200: %v", err)
	}

	for _, c := range []struct {
		name, token string
		want        int
	}{
		{"ServiceAccount bound to nodevigil-metrics-reader", cfgAllowed.BearerToken, http.StatusOK},
		{"ServiceAccount without the binding", cfgDenied.BearerToken, http.StatusForbidden},
		{"no token", "", http.StatusUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			var code int
			var body string
			// RBAC bindings reach the authorizer's cache a moment after they are created.
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
				code, body = get("https", "/metrics", c.token)
				return code == c.want, nil
			})
			if err != nil {
				t.Fatalf("GET /metrics: %d %q, want %d", code, truncate(body, 300), c.want)
			}
			hasMetrics := strings.Contains(body, "nodevigil_remediator_")
			if c.want == http.StatusOK && !hasMetrics {
				t.Errorf("200 without the remediator's metrics: %q", truncate(body, 300))
			}
			if c.want != http.StatusOK && hasMetrics {
				t.Errorf("refused with %d but the body has metrics", code)
			}
		})
	}
	code, body := get("http", "/metrics", cfgAllowed.BearerToken)
	if code == http.StatusOK || strings.Contains(body, "nodevigil_remediator_") {
		t.Errorf("plain HTTP got %d %q, want a refusal", code, truncate(body, 300))
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
