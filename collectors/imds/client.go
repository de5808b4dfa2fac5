package imds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// The metadata client: IMDSv2 only, over net/http, without the AWS SDK. The Watcher reads two
// paths every two seconds for the life of the node, and the SDK's client built a middleware
// stack for every read (about 9 KiB and 200 allocations per read, BenchmarkPollSpotGroup); this
// one reuses one keep-alive connection, one token and its request headers. It also reports its
// failures as types (tokenError, with whether the request was sent), where the SDK's token
// error had no Unwrap and was classified from its text.

const (
	// DefaultEndpoint is the metadata service's address on EC2.
	DefaultEndpoint = "http://169.254.169.254"
	// endpointEnv and disabledEnv are the SDK's environment variables, honoured the same way.
	endpointEnv = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
	disabledEnv = "AWS_EC2_METADATA_DISABLED"

	tokenPath      = "/latest/api/token"
	metadataPrefix = "/latest/meta-data/"
	tokenHeader    = "X-aws-ec2-metadata-token"
	ttlHeader      = "X-aws-ec2-metadata-token-ttl-seconds"
	// tokenTTL is the session token's lifetime asked for (the SDK's default, the maximum);
	// a token is renewed tokenRenewBefore its end.
	tokenTTL         = 6 * time.Hour
	tokenRenewBefore = time.Minute
	// maxBody bounds how much of an answer is read.
	maxBody = 64 << 10
)

// errDisabled is the client switched off by AWS_EC2_METADATA_DISABLED=true.
var errDisabled = errors.New("access disabled to EC2 IMDS by " + disabledEnv)

// tokenError is a failed session token request: Status is the HTTP status of an answer (0
// when none came), Sent whether the request was written to an open connection (then a missing
// answer was dropped on its way back: the hop limit).
type tokenError struct {
	Status int
	Sent   bool
	Err    error
}

func (e *tokenError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("failed to get API token: StatusCode: %d", e.Status)
	}
	return "failed to get API token: " + e.Err.Error()
}

func (e *tokenError) Unwrap() error { return e.Err }

// statusError is a metadata read answered with a status other than 200.
type statusError struct {
	Path   string
	Status int
}

func (e *statusError) Error() string {
	return fmt.Sprintf("metadata %s: StatusCode: %d", e.Path, e.Status)
}

// client reads metadata paths with a cached session token. Safe for concurrent use.
type client struct {
	base  string
	hc    *http.Client
	clock clock.PassiveClock

	mu      sync.Mutex
	token   string
	expires time.Time
}

// newClient returns a client of endpoint ("" for $AWS_EC2_METADATA_SERVICE_ENDPOINT, else
// DefaultEndpoint). No proxy from the environment: the service refuses proxied token requests.
func newClient(endpoint string, clk clock.PassiveClock) *client {
	if endpoint == "" {
		endpoint = os.Getenv(endpointEnv)
	}
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	return &client{
		base:  strings.TrimRight(endpoint, "/"),
		clock: clk,
		hc: &http.Client{
			Transport: &http.Transport{
				Proxy:               nil,
				DialContext:         (&net.Dialer{Timeout: time.Second, KeepAlive: -1}).DialContext,
				MaxIdleConns:        1,
				MaxIdleConnsPerHost: 1,
				IdleConnTimeout:     time.Minute,
				DisableCompression:  true,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// forget drops the session token, so the next read fetches a new one (after a 401: the
// service no longer knows it).
func (c *client) forget() {
	c.mu.Lock()
	c.token = ""
	c.mu.Unlock()
}

// get reads one metadata path: the body on 200, else a *statusError (404 is "not there"), a
// *tokenError, errDisabled or a transport error.
func (c *client) get(ctx context.Context, path string) (string, error) {
	if v, _ := strconv.ParseBool(os.Getenv(disabledEnv)); v {
		return "", errDisabled
	}
	tok, err := c.sessionToken(ctx)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+metadataPrefix+path, nil)
	if err != nil {
		return "", err
	}
	req.Header[tokenHeader] = []string{tok}
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", err
	}
	body, err := readBody(resp)
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode == http.StatusUnauthorized {
			c.forget()
		}
		return "", &statusError{Path: path, Status: resp.StatusCode}
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return body, nil
}

// readBody reads and closes a response body; the body of an error answer is drained (with
// io.Discard's pooled buffers) so the connection is reused, not kept.
func readBody(resp *http.Response) (string, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	return string(b), err
}

// sessionToken returns the cached token, fetching a new one when there is none or it is about
// to expire.
func (c *client) sessionToken(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != "" && c.clock.Now().Before(c.expires) {
		return c.token, nil
	}
	// WroteRequest runs on the transport's goroutine.
	var sent atomic.Bool
	trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			sent.Store(true)
		}
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPut, c.base+tokenPath, nil)
	if err != nil {
		return "", &tokenError{Err: err}
	}
	req.Header[ttlHeader] = []string{strconv.Itoa(int(tokenTTL / time.Second))}
	start := c.clock.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", &tokenError{Sent: sent.Load(), Err: err}
	}
	body, err := readBody(resp)
	if resp.StatusCode != http.StatusOK {
		return "", &tokenError{Status: resp.StatusCode, Sent: true, Err: fmt.Errorf("status %d", resp.StatusCode)}
	}
	if err != nil || body == "" {
		return "", &tokenError{Sent: true, Err: errors.Join(errors.New("empty session token"), err)}
	}
	ttl := tokenTTL
	if s, err := strconv.Atoi(resp.Header.Get(ttlHeader)); err == nil && s > 0 {
		ttl = time.Duration(s) * time.Second
	}
	c.token, c.expires = body, start.Add(max(ttl-tokenRenewBefore, ttl/2))
	return c.token, nil
}
