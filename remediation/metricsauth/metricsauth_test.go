package metricsauth

import (
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"log/slog"

	"k8s.io/client-go/kubernetes/fake"
)

// The reviews themselves are tested against a real API server in
// integration/install/metricsauth_test.go; these cases need none.
func TestHandlerWithoutAPIServer(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	h := Handler(fake.NewClientset(), slog.New(slog.DiscardHandler), next)
	tests := []struct {
		name, path, auth string
		want             int
	}{
		{"liveness probe is open", "/healthz", "", http.StatusOK},
		{"readiness probe is open", "/readyz", "", http.StatusOK},
		{"metrics without a token", "/metrics", "", http.StatusUnauthorized},
		{"basic auth is not a bearer token", "/metrics", "Basic dXNlcjpwYXNz", http.StatusUnauthorized},
		{"empty bearer", "/metrics", "Bearer ", http.StatusUnauthorized},
		{"other paths are guarded too", "/debug/pprof/", "", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tt.path, nil)
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Errorf("GET %s (%q) = %d, want %d", tt.path, tt.auth, rec.Code, tt.want)
			}
		})
	}
}

func TestTLSConfig(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	cfg, err := TLSConfig("", "", []string{"nodevigil-remediator-0", "localhost"}, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.VerifyHostname("localhost"); err != nil {
		t.Errorf("self-signed certificate: %v", err)
	}
	if !leaf.NotAfter.Equal(now.Add(365 * 24 * time.Hour).Truncate(time.Second)) {
		t.Errorf("NotAfter = %s", leaf.NotAfter)
	}

	dir := t.TempDir()
	tests := []struct {
		name, cert, key, want string
	}{
		{"cert without key", "/c.pem", "", "must be set together"},
		{"missing file", filepath.Join(dir, "no.crt"), filepath.Join(dir, "no.key"), "--metrics-tls-cert-file"},
		{"not PEM", filepath.Join(dir, "bad.crt"), filepath.Join(dir, "bad.crt"), "load metrics TLS certificate"},
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.crt"), []byte("nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := TLSConfig(tt.cert, tt.key, nil, now)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("TLSConfig(%q, %q) = %v, want an error containing %q", tt.cert, tt.key, err, tt.want)
			}
		})
	}
}
