package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// pprofHandler serves Go's runtime profiles under /debug/pprof/. It is built on its own mux,
// never on http.DefaultServeMux, so nothing else the process registers is exposed with it.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// servePprof listens on addr (a loopback address, checked by validate) and serves the profiles
// until the returned server is shut down. The profiles are off by default and on a listener of
// their own: /metrics is behind TokenReview on a pod address, while a profile endpoint shows
// goroutine stacks and the command line, so it is reachable only from inside the pod's network
// namespace (kubectl port-forward), needing no token and no RBAC.
func servePprof(addr string) (*http.Server, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on --pprof-address %s: %w", addr, err)
	}
	// No WriteTimeout: a CPU profile or trace streams for its ?seconds=.
	srv := &http.Server{Handler: pprofHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, ln.Addr(), nil
}
