package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// apiCounter is a reverse proxy between the remediator and kube-apiserver that counts every
// request the remediator sends, by verb and resource, as the apiserver would name them. The
// remediator's kubeconfig points at it (plain HTTP on loopback, no credentials); it forwards
// with the harness's admin credentials. The apiserver's own apiserver_request_total cannot
// tell the remediator from the load generator renewing 20,000 Leases (it has no user-agent
// label), and the remediator runs as a separate process, so its client cannot be wrapped
// from here: the proxy is the counting RoundTripper, one hop out. The apiserver's count is
// read too (apiserverCounts) and, less the load generator's own requests (countingTransport),
// printed beside the proxy's as the server-side check.
type apiCounter struct {
	proxy *httputil.ReverseProxy
	srv   *http.Server
	addr  string

	mu     sync.Mutex
	counts map[string]int64 // "verb resource" → requests
}

// startAPICounter listens on loopback and forwards to the API server of rc.
func startAPICounter(rc *rest.Config) (*apiCounter, error) {
	target, err := url.Parse(rc.Host)
	if err != nil {
		return nil, fmt.Errorf("API server URL %q: %w", rc.Host, err)
	}
	rt, err := rest.TransportFor(rc)
	if err != nil {
		return nil, fmt.Errorf("API transport: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &apiCounter{addr: l.Addr().String(), counts: map[string]int64{}}
	a.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport:     rt,
		FlushInterval: -1, // watches stream
	}
	a.srv = &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = a.srv.Serve(l) }()
	return a, nil
}

func (a *apiCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := requestKey(r.Method, r.URL)
	a.mu.Lock()
	a.counts[key]++
	a.mu.Unlock()
	a.proxy.ServeHTTP(w, r)
}

func (a *apiCounter) close() { _ = a.srv.Close() }

// snapshot returns the counts so far.
func (a *apiCounter) snapshot() map[string]int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int64, len(a.counts))
	for k, v := range a.counts {
		out[k] = v
	}
	return out
}

// writeKubeconfig writes a kubeconfig that sends the remediator through the counter.
func (a *apiCounter) writeKubeconfig(dir string) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["counted"] = &clientcmdapi.Cluster{Server: "http://" + a.addr}
	cfg.AuthInfos["counted"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["counted"] = &clientcmdapi.Context{Cluster: "counted", AuthInfo: "counted"}
	cfg.CurrentContext = "counted"
	path := filepath.Join(dir, "kubeconfig-counted")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig: %w", err)
	}
	return path, os.Chmod(path, 0o600)
}

// requestKey names a request "verb resource[/subresource]" the way the apiserver's
// apiserver_request_total does (LIST, WATCH, GET, CREATE, UPDATE, PATCH, DELETE), or "GET
// discovery" for paths outside /api/v1 and /apis/<group>/<version>.
func requestKey(method string, u *url.URL) string {
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return method + " discovery"
	}
	if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) > 2 {
		rest = rest[2:]
	}
	resource, named := rest[0], len(rest) > 1
	if len(rest) > 2 {
		resource += "/" + rest[2]
	}
	verb := method
	switch method {
	case http.MethodGet:
		switch {
		case named:
			verb = "GET"
		case u.Query().Get("watch") == "true" || u.Query().Get("watch") == "1":
			verb = "WATCH"
		default:
			verb = "LIST"
		}
	case http.MethodPost:
		verb = "CREATE"
	case http.MethodPut:
		verb = "UPDATE"
	case http.MethodDelete:
		if !named {
			verb = "DELETECOLLECTION"
		}
	}
	return verb + " " + resource
}

// apiRate is the requests of one window, per minute, by key.
type apiRate struct {
	window time.Duration
	byKey  map[string]float64
	total  float64
}

func rateBetween(before, after map[string]int64, window time.Duration) apiRate {
	r := apiRate{window: window, byKey: map[string]float64{}}
	mins := window.Minutes()
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			r.byKey[k] = float64(d) / mins
			r.total += float64(d) / mins
		}
	}
	return r
}

// String lists the keys by decreasing rate.
func (r apiRate) String() string {
	keys := make([]string, 0, len(r.byKey))
	for k := range r.byKey {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if r.byKey[a] != r.byKey[b] {
			if r.byKey[a] > r.byKey[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, r.byKey[k]))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("**%.1f per minute** over %s (none)", r.total, r.window.Round(time.Second))
	}
	return fmt.Sprintf("**%.1f per minute** over %s: %s", r.total, r.window.Round(time.Second), strings.Join(parts, " · "))
}

// countsBetween is the requests of one window, as totals, by key.
func countsBetween(before, after map[string]int64) string {
	var total int64
	keys := []string{}
	for k, v := range after {
		if v-before[k] > 0 {
			keys = append(keys, k)
			total += v - before[k]
		}
	}
	slices.SortFunc(keys, func(a, b string) int {
		da, db := after[a]-before[a], after[b]-before[b]
		if da != db {
			if da > db {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, after[k]-before[k]))
	}
	return fmt.Sprintf("%d: %s", total, strings.Join(parts, " · "))
}

// tally counts requests by requestKey.
type tally struct {
	mu     sync.Mutex
	counts map[string]int64
}

func (t *tally) add(key string) {
	t.mu.Lock()
	if t.counts == nil {
		t.counts = map[string]int64{}
	}
	t.counts[key]++
	t.mu.Unlock()
}

func (t *tally) snapshot() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int64, len(t.counts))
	for k, v := range t.counts {
		out[k] = v
	}
	return out
}

// countingTransport counts the load generator's own requests, so that they can be subtracted
// from the apiserver's count.
type countingTransport struct {
	next http.RoundTripper
	t    *tally
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.t.add(requestKey(r.Method, r.URL))
	return c.next.RoundTrip(r)
}

// apiserverCounts scrapes kube-apiserver's apiserver_request_total and sums it by verb and
// resource[/subresource], keyed as requestKey keys them.
func apiserverCounts(ctx context.Context, rc *rest.Config) (map[string]float64, error) {
	httpc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("apiserver metrics client: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rc.Host+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("apiserver metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("apiserver metrics: %s", resp.Status)
	}
	const series = "apiserver_request_total{"
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, series) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < len(series) {
			continue
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(line[len(series):end], ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				labels[k] = strings.Trim(v, `"`)
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil || labels["resource"] == "" {
			continue
		}
		// The apiserver names writes by their HTTP method; requestKey by their meaning.
		verb := labels["verb"]
		switch verb {
		case "PUT":
			verb = "UPDATE"
		case "POST":
			verb = "CREATE"
		}
		key := verb + " " + labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		out[key] += v
	}
	return out, sc.Err()
}

// serverSideRate is the apiserver's count of a window less the load generator's, per minute,
// by key: what every other client (the remediator, and kube-apiserver's own loopback clients)
// sent.
func serverSideRate(srvBefore, srvAfter map[string]float64, genBefore, genAfter map[string]int64, window time.Duration) apiRate {
	r := apiRate{window: window, byKey: map[string]float64{}}
	mins := window.Minutes()
	for k, v := range srvAfter {
		d := v - srvBefore[k] - float64(genAfter[k]-genBefore[k])
		if d > 0.5 {
			r.byKey[k] = d / mins
			r.total += d / mins
		}
	}
	return r
}
