package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRun: each command reaches the running devcluster with the right method, path and query;
// bad input is refused before any request, naming what is wrong; a refusal from the server
// (an unknown node) becomes the error.
func TestRun(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Method + " " + r.URL.Path + "?" + r.URL.RawQuery
		if r.URL.Query().Get("target") == "nope" {
			http.Error(w, "no live node \"nope\"", http.StatusBadRequest)
			return
		}
		w.Write([]byte("done\n"))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	tests := []struct {
		args    []string
		request string // "" means no request may be sent
		out     string
		err     string
	}{
		{args: []string{"fault", "kubelet-oom", "general-a-1"}, request: "POST /fault?kind=kubelet-oom&target=general-a-1", out: "done"},
		{args: []string{"fault", "zone-dark", "us-east-1b"}, request: "POST /fault?kind=zone-dark&target=us-east-1b", out: "done"},
		{args: []string{"heal", "general-a-1"}, request: "POST /heal?target=general-a-1", out: "done"},
		{args: []string{"nodes"}, request: "GET /nodes?", out: "done"},
		{args: []string{"restart-leader"}, request: "POST /restart-leader?", out: "done"},
		{args: []string{"restart-leader", "now"}, err: "usage: fleetctl"},
		{args: []string{"faults"}, out: "bad-taint"},
		{args: []string{"fault", "kubelet-gone", "general-a-1"}, err: `unknown fault "kubelet-gone"; one of: kubelet-oom, kubelet-dead`},
		{args: []string{"fault", "kubelet-oom"}, err: "usage: fleetctl"},
		{args: []string{}, err: "usage: fleetctl"},
		{args: []string{"heal", "nope"}, request: "POST /heal?target=nope", err: `no live node "nope"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			got = ""
			var out bytes.Buffer
			err := run(append([]string{"--addr", addr}, tt.args...), &out)
			if got != tt.request {
				t.Errorf("request %q, want %q", got, tt.request)
			}
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want it to contain %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tt.out) {
				t.Errorf("output %q, want it to contain %q", out.String(), tt.out)
			}
		})
	}
}
