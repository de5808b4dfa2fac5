package imds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// The IMDSv2 protocol, as AWS documents it ("Use the Instance Metadata Service to access
// instance metadata", "How Instance Metadata Service Version 2 works").
const (
	tokenPath      = "/latest/api/token"
	metadataPrefix = "/latest/meta-data/"
	tokenHeader    = "X-Aws-Ec2-Metadata-Token"
	tokenTTLHeader = "X-Aws-Ec2-Metadata-Token-Ttl-Seconds"
	// tokenTTL is the longest a session token may live (6 h), the SDK's default too.
	tokenTTL = 21600 * time.Second
	// tokenRefresh is how long before its expiry a token is replaced, so a read never
	// carries a token that expires on the way.
	tokenRefresh = time.Minute
	// maxBody bounds what one answer may hold; the largest, events/maintenance/scheduled,
	// is a few hundred bytes per event.
	maxBody = 64 << 10

	// envEndpoint and envEndpointMode are the SDK's standard variables naming the
	// metadata service's address; the client honours them as the SDK's does.
	envEndpoint     = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
	envEndpointMode = "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE"
	defaultEndpoint = "http://169.254.169.254"
	ipv6Endpoint    = "http://[fd00:ec2::254]"
)

// errEnvDisabled is a read refused without a request because AWS_EC2_METADATA_DISABLED=true.
var errEnvDisabled = errors.New("the metadata client is disabled by " + envMetadataDisabled)

// statusError is an answer other than 200.
type statusError struct {
	op     string
	status int
}

func (e *statusError) Error() string { return fmt.Sprintf("%s: HTTP %d", e.op, e.status) }

// client speaks IMDSv2 over one kept-alive HTTP connection: a session token from PUT
// /latest/api/token, cached until shortly before its TTL and replaced after a 401, sent with
// every GET of /latest/meta-data/<path>. There is no IMDSv1 fallback: a read without a token
// is never made.
//
// Why not aws-sdk-go-v2's feature/ec2/imds client, which the watcher used until session 8:
// a spot instance reads the service every 2 s for its whole life, and the SDK builds and runs
// a middleware stack of some twenty steps for every read (about 140 allocations and most of
// a poll's CPU, docs/benchmarks.md "Agent steady state"). The protocol is two requests; this
// is those two requests. The SDK stays where it earns its keep (EC2's API, in the remediator)
// and in the emulator's tests, which check integration/ec2emu against the SDK client.
type client struct {
	base      string // scheme://host, no trailing slash
	rt        http.RoundTripper
	clock     clock.PassiveClock
	disabled  bool
	tokenURL  *url.URL
	pathURLs  map[string]*url.URL // metadata path → URL, built once
	pathMu    sync.Mutex
	tokenMu   sync.Mutex
	token     string
	expiresAt time.Time
}

// endpointFor is the base URL a client reads: configured, else the SDK's variables, else
// the link-local address.
func endpointFor(configured string) string {
	if configured != "" {
		return strings.TrimRight(configured, "/")
	}
	if e := os.Getenv(envEndpoint); e != "" {
		return strings.TrimRight(e, "/")
	}
	if strings.EqualFold(os.Getenv(envEndpointMode), "IPv6") {
		return ipv6Endpoint
	}
	return defaultEndpoint
}

func newClient(endpoint string, clk clock.PassiveClock, disabled bool) *client {
	base := endpointFor(endpoint)
	// Validate rejected a configured endpoint that is not a URL; a bad environment variable
	// makes every read fail, naming it (url).
	tu, _ := url.Parse(base + tokenPath)
	return &client{
		base: base, clock: clk, disabled: disabled, tokenURL: tu, pathURLs: map[string]*url.URL{},
		rt: &http.Transport{
			// Link-local and per instance: never through a proxy (the real service
			// refuses token requests that went through one).
			Proxy:               nil,
			DialContext:         (&net.Dialer{KeepAlive: -1}).DialContext,
			MaxIdleConns:        2,
			MaxIdleConnsPerHost: 2,
			// Longer than the longest poll interval a default agent has (1 m), so the
			// connection is kept between polls and no read pays a handshake.
			IdleConnTimeout:    90 * time.Second,
			DisableCompression: true,
		},
	}
}

// url returns the URL of a metadata path, parsed once.
func (c *client) url(path string) (*url.URL, error) {
	c.pathMu.Lock()
	defer c.pathMu.Unlock()
	if u, ok := c.pathURLs[path]; ok {
		return u, nil
	}
	u, err := url.Parse(c.base + metadataPrefix + path)
	if err != nil {
		return nil, fmt.Errorf("metadata endpoint %q: %w", c.base, err)
	}
	c.pathURLs[path] = u
	return u, nil
}

// forgetToken drops the cached session token (the service answered 401: it no longer knows
// it, e.g. it restarted); the next read fetches a new one.
func (c *client) forgetToken() {
	c.tokenMu.Lock()
	c.token = ""
	c.tokenMu.Unlock()
}

// sessionToken returns the cached token or fetches a new one, recording in tr what the
// token request saw (its status and error) for classify.
func (c *client) sessionToken(ctx context.Context, tr *tracker) (string, error) {
	c.tokenMu.Lock()
	defer c.tokenMu.Unlock()
	now := c.clock.Now()
	if c.token != "" && now.Before(c.expiresAt) {
		return c.token, nil
	}
	req := (&http.Request{
		Method: http.MethodPut, URL: c.tokenURL, Host: c.tokenURL.Host,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{tokenTTLHeader: {strconv.Itoa(int(tokenTTL / time.Second))}},
	}).WithContext(ctx)
	body, status, err := c.do(req)
	if err == nil && status != http.StatusOK {
		err = &statusError{op: "PUT " + tokenPath, status: status}
	}
	if err == nil && len(body) == 0 {
		err = fmt.Errorf("PUT %s: empty session token", tokenPath)
	}
	if err != nil {
		tr.tokenStatus, tr.tokenErr = status, err
		return "", fmt.Errorf("session token: %w", err)
	}
	c.token, c.expiresAt = strings.TrimSpace(string(body)), now.Add(tokenTTL-tokenRefresh)
	return c.token, nil
}

// get reads one metadata path: the body of a 200, or an error (a *statusError for any other
// answer, recorded in tr.status).
func (c *client) get(ctx context.Context, tr *tracker, path string) ([]byte, error) {
	if c.disabled {
		return nil, errEnvDisabled
	}
	u, err := c.url(path)
	if err != nil {
		return nil, err
	}
	tok, err := c.sessionToken(ctx, tr)
	if err != nil {
		return nil, err
	}
	req := (&http.Request{
		Method: http.MethodGet, URL: u, Host: u.Host,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{tokenHeader: {tok}},
	}).WithContext(ctx)
	body, status, err := c.do(req)
	tr.status = status
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if status != http.StatusOK {
		if status == http.StatusUnauthorized {
			c.forgetToken()
		}
		return nil, &statusError{op: "GET " + path, status: status}
	}
	return body, nil
}

// do makes one request and reads its answer whole (up to maxBody), so the connection goes
// back to the pool for the next poll. A 200's body is returned; others are drained.
func (c *client) do(req *http.Request) ([]byte, int, error) {
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		if cerr := req.Context().Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", cerr, err)
		}
		return nil, 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		return nil, resp.StatusCode, nil
	}
	var buf bytes.Buffer
	if resp.ContentLength > 0 && resp.ContentLength <= maxBody {
		buf.Grow(int(resp.ContentLength) + 1) // +1: ReadFrom wants room to see EOF
	}
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, maxBody)); err != nil {
		return nil, resp.StatusCode, fmt.Errorf("read answer: %w", err)
	}
	return buf.Bytes(), resp.StatusCode, nil
}

// closeIdle closes the kept-alive connection (the Watcher stopped).
func (c *client) closeIdle() {
	if t, ok := c.rt.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
}
