package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// connServer is a loopback HTTP server that counts the connections it accepted.
func connServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var conns atomic.Int32
	hs := httptest.NewUnstartedServer(h)
	hs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	hs.Start()
	t.Cleanup(hs.Close)
	return hs, &conns
}

func get(t *testing.T, c *ConnClient, ctx context.Context, url string, read bool) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	var body []byte
	if read {
		body, err = io.ReadAll(resp.Body)
	}
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	return resp.StatusCode, string(body), err
}

func TestConnClientKeepsOneConnection(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", maxDrain+1)
	for _, tc := range []struct {
		name      string
		path      string
		read      bool
		wantConns int32
	}{
		{"bodies read", "/small", true, 1},
		{"bodies left unread are drained", "/small", false, 1},
		{"404s keep the connection", "/missing", true, 1},
		{"a body too large to drain closes it", "/big", false, 3},
		{"the service closes it after each answer", "/close", true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hs, conns := connServer(t, func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/small":
					_, _ = io.WriteString(w, "none")
				case "/big":
					_, _ = io.WriteString(w, big)
				case "/close":
					w.Header().Set("Connection", "close")
					_, _ = io.WriteString(w, "bye")
				default:
					http.NotFound(w, r)
				}
			})
			c := &ConnClient{}
			for i := range 3 {
				if _, _, err := get(t, c, context.Background(), hs.URL+tc.path, tc.read); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			if got := conns.Load(); got != tc.wantConns {
				t.Errorf("connections = %d, want %d", got, tc.wantConns)
			}
		})
	}
}

// The service (or something between) closing an idle kept connection: the next request is
// sent once more on a new connection instead of failing the poll.
func TestConnClientRedialsAClosedConnection(t *testing.T) {
	t.Parallel()
	hs, conns := connServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	c := &ConnClient{}
	if _, _, err := get(t, c, context.Background(), hs.URL, true); err != nil {
		t.Fatal(err)
	}
	hs.CloseClientConnections()
	code, body, err := get(t, c, context.Background(), hs.URL, true)
	if err != nil || code != 200 || body != "ok" {
		t.Fatalf("after the service closed the connection: %d %q %v, want 200 \"ok\"", code, body, err)
	}
	if got := conns.Load(); got != 2 {
		t.Errorf("connections = %d, want 2", got)
	}
}

// An answer that never comes (the hop-limit drop) ends at the header timeout as a network
// timeout, which the Watcher's classification reads; a cancel ends the wait at once. The next
// request works on a new connection.
func TestConnClientTimeouts(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	hs, _ := connServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hang" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	for _, tc := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		timeout bool
	}{
		{"header timeout", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, true},
		{"context deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, true},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			return ctx, cancel
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &ConnClient{HeaderTimeout: 100 * time.Millisecond}
			if tc.name != "header timeout" {
				c.HeaderTimeout = time.Minute
			}
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			_, _, err := get(t, c, ctx, hs.URL+"/hang", true)
			if err == nil {
				t.Fatal("no error from an answer that never came")
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("waited %v", d)
			}
			if got := timedOut(err); got != tc.timeout {
				t.Errorf("timedOut(%v) = %v, want %v", err, got, tc.timeout)
			}
			if !tc.timeout && !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
			code, body, err := get(t, c, context.Background(), hs.URL, true)
			if err != nil || code != 200 || body != "ok" {
				t.Fatalf("next request: %d %q %v", code, body, err)
			}
		})
	}
}

// Requests from several goroutines take turns on the one connection.
func TestConnClientSerializes(t *testing.T) {
	t.Parallel()
	hs, conns := connServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.URL.Path) })
	c := &ConnClient{HeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 4 {
		wg.Go(func() {
			for range 10 {
				path := "/" + string(rune('a'+i))
				_, body, err := get(t, c, context.Background(), hs.URL+path, true)
				if err == nil && body != path {
					err = errors.New("body " + body + " for " + path)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("connections = %d, want 1", got)
	}
}

// timedOut: err is a deadline or a network timeout (as collectors/imds classifies it).
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
