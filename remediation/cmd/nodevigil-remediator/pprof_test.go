package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestPprofAddressLoopbackAccepted(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:6060", "localhost:6060", "[::1]:6060", "127.0.0.1:0"} {
		o, err := parseOptions([]string{"--pprof-address=" + addr}, &bytes.Buffer{})
		if err != nil {
			t.Errorf("%s: %v", addr, err)
			continue
		}
		if o.pprofAddress != addr {
			t.Errorf("%s: pprofAddress = %q", addr, o.pprofAddress)
		}
	}
	o, err := parseOptions(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.pprofAddress != "" {
		t.Errorf("pprof is on by default: %q", o.pprofAddress)
	}
}

func TestServePprof(t *testing.T) {
	srv, addr, err := servePprof("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, tt := range []struct {
		path string
		code int
		body string
	}{
		{"/debug/pprof/", http.StatusOK, "goroutine"},
		{"/debug/pprof/goroutine?debug=1", http.StatusOK, "servePprof"},
		{"/debug/pprof/heap?debug=1", http.StatusOK, "heap profile"},
		{"/metrics", http.StatusNotFound, ""},
	} {
		resp, err := http.Get("http://" + addr.String() + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || !strings.Contains(string(b), tt.body) {
			t.Errorf("GET %s = %d %.200q, want %d containing %q", tt.path, resp.StatusCode, b, tt.code, tt.body)
		}
	}
}
