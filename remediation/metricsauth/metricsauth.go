// Package metricsauth guards the remediator's /metrics the way kube-rbac-proxy and
// controller-runtime's secure metrics server do: over TLS, a scraper must present a bearer
// token the API server accepts (TokenReview) and that user must be allowed to "get" the
// non-resource URL /metrics (SubjectAccessReview). The metrics name the cluster's pools, zones
// and failure counts, and nothing else in the remediator's pod needs to be public.
//
// The probes (/healthz, /readyz) stay open: the kubelet probes without credentials (it skips
// certificate verification for HTTPS probes).
package metricsauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// OpenPaths are served without authentication: the kubelet's probes.
var OpenPaths = map[string]bool{"/healthz": true, "/readyz": true}

// Handler wraps next: OpenPaths pass; every other path needs a bearer token that
// authenticates (TokenReview) and is authorised to get that path (SubjectAccessReview).
// No or a rejected token gets 401, an authenticated user without the permission 403, and a
// failed review call 500 (logged with err), so a scraper can tell a wrong token from a
// missing ClusterRoleBinding from an API server problem.
func Handler(client kubernetes.Interface, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if OpenPaths[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="nodevigil-remediator"`)
			http.Error(w, "Unauthorized: a bearer token is required", http.StatusUnauthorized)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		user, ok, err := authenticate(ctx, client, token)
		if err != nil {
			log.Error("token review failed", "err", err)
			http.Error(w, "Internal Server Error: token review failed", http.StatusInternalServerError)
			return
		}
		if !ok {
			http.Error(w, "Unauthorized: token not accepted", http.StatusUnauthorized)
			return
		}
		allowed, err := authorize(ctx, client, user, r.URL.Path, verb(r.Method))
		if err != nil {
			log.Error("subject access review failed", "err", err)
			http.Error(w, "Internal Server Error: subject access review failed", http.StatusInternalServerError)
			return
		}
		if !allowed {
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not %s %s", user.Username, verb(r.Method), r.URL.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	t := strings.TrimSpace(h[len(prefix):])
	return t, t != ""
}

// verb maps an HTTP method to the verb of a non-resource URL, as the API server does.
func verb(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(method)
}

func authenticate(ctx context.Context, c kubernetes.Interface, token string) (authnv1.UserInfo, bool, error) {
	tr, err := c.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token},
	}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.UserInfo{}, false, fmt.Errorf("create TokenReview: %w", err)
	}
	return tr.Status.User, tr.Status.Authenticated, nil
}

func authorize(ctx context.Context, c kubernetes.Interface, u authnv1.UserInfo, path, verb string) (bool, error) {
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: verb},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("create SubjectAccessReview: %w", err)
	}
	return sar.Status.Allowed, nil
}

// TLSConfig loads certFile and keyFile (a mounted kubernetes.io/tls Secret), or, when both
// are empty, generates a self-signed ECDSA P-256 certificate for hosts valid one year: enough
// for Prometheus scraping with insecure_skip_verify, as the kubelet's probes do.
func TLSConfig(certFile, keyFile string, hosts []string, now time.Time) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("--metrics-tls-cert-file and --metrics-tls-key-file must be set together (got %q and %q)", certFile, keyFile)
	}
	var cert tls.Certificate
	var err error
	if certFile != "" {
		if _, err := os.Stat(certFile); err != nil {
			return nil, fmt.Errorf("--metrics-tls-cert-file: %w", err)
		}
		cert, err = tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load metrics TLS certificate %s: %w", certFile, err)
		}
	} else {
		cert, err = SelfSigned(hosts, now)
		if err != nil {
			return nil, err
		}
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// SelfSigned makes a self-signed serving certificate for hosts (DNS names or IPs).
func SelfSigned(hosts []string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate metrics TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "nodevigil-remediator"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     hosts,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-sign metrics TLS certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
