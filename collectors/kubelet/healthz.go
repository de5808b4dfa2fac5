package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
)

// healthzObservation is the outcome of one GET /healthz.
type healthzObservation struct {
	// reached is true once a connection to the endpoint was established: a timeout after
	// that is a hung kubelet (observed), not an unreachable one (unobserved).
	reached bool
	status  int
	body    string
	latency time.Duration
	err     error
}

func (h healthzObservation) ok() bool { return h.err == nil && h.status == http.StatusOK }

// describe renders the observation with its numbers for messages.
func (h healthzObservation) describe() string {
	lat := roundDuration(h.latency)
	switch {
	case h.ok():
		return fmt.Sprintf("/healthz 200 in %s", lat)
	case h.err == nil:
		if h.body != "" {
			return fmt.Sprintf("/healthz returned %d in %s: %q", h.status, lat, h.body)
		}
		return fmt.Sprintf("/healthz returned %d in %s", h.status, lat)
	case errors.Is(h.err, context.DeadlineExceeded) && h.reached:
		return fmt.Sprintf("/healthz accepted the connection but did not answer within %s", lat)
	case errors.Is(h.err, context.DeadlineExceeded):
		return fmt.Sprintf("/healthz did not answer within %s", lat)
	default:
		return fmt.Sprintf("/healthz failed after %s: %v", lat, h.err)
	}
}

// probeHealthz GETs url with ctx (which carries the check's deadline). The latency is
// measured with the monotonic wall clock: it is a measurement, not a decision input.
func probeHealthz(ctx context.Context, client *http.Client, url string) healthzObservation {
	var obs healthzObservation
	// GotConn may run on a transport goroutine; keep the flag atomic.
	var reached atomic.Bool
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { reached.Store(true) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, url, nil)
	if err != nil {
		obs.err = fmt.Errorf("build /healthz request: %w", err)
		return obs
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		obs.latency = time.Since(start)
		obs.reached = reached.Load()
		obs.err = fmt.Errorf("get %s: %w", url, err)
		return obs
	}
	defer resp.Body.Close()
	obs.reached = true
	obs.status = resp.StatusCode
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes))
	// Drain a little more so the connection can be reused; a healthz body is tiny.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	obs.latency = time.Since(start)
	if err != nil && resp.StatusCode == http.StatusOK {
		obs.err = fmt.Errorf("read %s body: %w", url, err)
		return obs
	}
	if resp.StatusCode != http.StatusOK {
		obs.body = printable(string(body))
	}
	return obs
}

// printable trims a body for quoting in a message.
func printable(s string) string {
	s = strings.TrimSpace(s)
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) || r == ' ' {
			return r
		}
		return ' '
	}, s)
}
