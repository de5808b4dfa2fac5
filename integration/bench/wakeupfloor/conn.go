package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"
)

// ConnClient is an HTTP client for the "conn" variants: one kept-alive connection, each
// request written and its answer read in the caller's goroutine, where net/http's Transport
// runs a read loop and a write loop goroutine per connection and hands every request and
// answer between them and the caller. It measures what those hand-offs cost a 2 s poll.
//
// It was tried in session 9 as the transport under the SDK's metadata client in the agent
// (imds.Options.HTTPClient): ~20 % fewer thread wake-ups per poll here, in a process of its
// own, but no gain measured in the agent (docs/benchmarks.md, "Session 9"), so the agent
// keeps the SDK's own transport. It keeps the SDK's 250 ms dial and 500 ms answer timeouts.
// One request at a time; no redirects.
type ConnClient struct {
	// DialTimeout bounds a new connection (default 250ms, the SDK's for this service).
	DialTimeout time.Duration
	// HeaderTimeout bounds the wait for an answer (default 500ms, the SDK's); negative:
	// only the request's context bounds it.
	HeaderTimeout time.Duration

	sem  chan struct{} // one request (and its body) at a time
	conn net.Conn      // the kept connection; nil when none
	br   *bufio.Reader
	bw   *bufio.Writer
	once sync.Once
}

// Default timeouts, the SDK's for the metadata service (feature/ec2/imds).
const (
	defaultDialTimeout   = 250 * time.Millisecond
	defaultHeaderTimeout = 500 * time.Millisecond
)

// maxDrain is how much of an unread body Close reads to keep the connection; more and the
// connection is closed instead.
const maxDrain = 64 << 10

func (c *ConnClient) init() {
	c.once.Do(func() { c.sem = make(chan struct{}, 1) })
}

// Do sends req and returns its answer. The answer's body must be closed; the connection is
// kept for the next request when the body was read to its end (Close reads what is left,
// up to 64 KiB).
func (c *ConnClient) Do(req *http.Request) (*http.Response, error) {
	c.init()
	ctx := req.Context()
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	resp, err := c.roundTrip(ctx, req, c.conn != nil)
	if err != nil {
		<-c.sem
		return nil, err
	}
	return resp, nil
}

func (c *ConnClient) roundTrip(ctx context.Context, req *http.Request, reused bool) (*http.Response, error) {
	if req.URL == nil || req.URL.Scheme != "http" {
		return nil, fmt.Errorf("imds: unsupported URL %v: the metadata service is plain http", req.URL)
	}
	if c.conn == nil {
		d := net.Dialer{Timeout: c.DialTimeout}
		if d.Timeout == 0 {
			d.Timeout = defaultDialTimeout
		}
		addr := req.URL.Host
		if req.URL.Port() == "" {
			addr = net.JoinHostPort(req.URL.Hostname(), "80")
		}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		c.conn = conn
		c.br = bufio.NewReaderSize(conn, 4<<10)
		c.bw = bufio.NewWriterSize(conn, 4<<10)
	}
	conn := c.conn
	if tr := httptrace.ContextClientTrace(ctx); tr != nil && tr.GotConn != nil {
		tr.GotConn(httptrace.GotConnInfo{Conn: conn, Reused: reused})
	}
	// The request's context ends the wait (its deadline or a cancel) through the context's
	// own timer: nothing more is armed.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	if hdr := c.HeaderTimeout; hdr >= 0 {
		if hdr == 0 {
			hdr = defaultHeaderTimeout
		}
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > hdr {
			// Read deadline only: a request of a few hundred bytes never waits to be
			// written, and each deadline is a runtime timer armed and removed.
			_ = conn.SetReadDeadline(time.Now().Add(hdr))
		}
	}
	err := req.Write(c.bw)
	if err == nil {
		err = c.bw.Flush()
	}
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(c.br, req)
	}
	if err != nil {
		stop()
		c.drop()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		var ne net.Error
		if reused && (req.Body == nil || req.Body == http.NoBody) && !(errors.As(err, &ne) && ne.Timeout()) {
			// The service closed the kept connection while it was idle: once more on a new one.
			return c.roundTrip(ctx, req, false)
		}
		return nil, err
	}
	resp.Body = &connBody{c: c, r: resp.Body, keep: !resp.Close, stop: stop}
	return resp, nil
}

// drop closes the kept connection.
func (c *ConnClient) drop() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.br, c.bw = nil, nil, nil
	}
}

// CloseIdleConnections closes the kept connection if no request is under way.
func (c *ConnClient) CloseIdleConnections() {
	c.init()
	select {
	case c.sem <- struct{}{}:
		c.drop()
		<-c.sem
	default:
	}
}

// connBody is an answer's body; closing it frees the ConnClient for the next request.
type connBody struct {
	c      *ConnClient
	r      io.ReadCloser
	keep   bool
	stop   func() bool // the context's watch; false once it has ended the connection
	eof    bool
	closed bool
}

func (b *connBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, errors.New("imds: read on a closed body")
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof = true
	} else if err != nil {
		b.keep = false
	}
	return n, err
}

func (b *connBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	if b.keep && !b.eof {
		n, err := io.Copy(io.Discard, io.LimitReader(b.r, maxDrain+1))
		b.keep = err == nil && n <= maxDrain
	}
	_ = b.r.Close()
	if !b.stop() {
		b.keep = false // the context ended while the body was read: its deadline is set
	}
	if b.keep {
		_ = b.c.conn.SetReadDeadline(time.Time{}) // no timer left armed while idle
	} else {
		b.c.drop()
	}
	<-b.c.sem
	return nil
}
