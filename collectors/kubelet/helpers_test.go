package kubelet

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for Config.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// roundTripFunc lets a test answer /healthz without a server.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// healthzClient answers every request with status and body, or with err.
func healthzClient(status int, body string, err error) *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if err != nil {
			return nil, err
		}
		return &http.Response{
			StatusCode: status,
			Body:       io.NopCloser(strings.NewReader(body)),
			Header:     http.Header{},
			Request:    r,
		}, nil
	})}
}

var errConnRefused = errors.New("dial tcp 127.0.0.1:10248: connect: connection refused")

// fakeUnits is a scripted unitReader / unitRestarter.
type fakeUnits struct {
	mu        sync.Mutex
	state     unitState
	err       error
	restarts  int
	resets    int
	jobResult string
	jobErr    error
}

func (f *fakeUnits) set(st unitState, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state, f.err = st, err
}

func (f *fakeUnits) readUnit(context.Context) (unitState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state, f.err
}

func (f *fakeUnits) restartUnit(_ context.Context, resetFailed bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restarts++
	if resetFailed {
		f.resets++
	}
	if f.jobErr != nil {
		return "", f.jobErr
	}
	if f.jobResult == "" {
		return "done", nil
	}
	return f.jobResult, nil
}

func (f *fakeUnits) close() error { return nil }

func (f *fakeUnits) counts() (restarts, resets int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restarts, f.resets
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// newTestCollector builds a collector whose systemd side is units.
func newTestCollector(t testing.TB, cfg Config, units unitReader) *Collector {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	if cfg.HostRoot == "" {
		// Not the machine's own /proc: without a fixture, the process table is unknown.
		cfg.HostRoot = t.TempDir()
	}
	if cfg.HealthzFailureThreshold == 0 {
		cfg.HealthzFailureThreshold = 1 // most tests judge single probes; debouncing has its own test
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if units != nil {
		c.units = units
	}
	return c
}
