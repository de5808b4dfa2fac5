package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

func TestParseInstance(t *testing.T) {
	tests := []struct {
		spec    string
		want    ec2emu.Instance
		wantErr string
	}{
		{spec: "i-0123456789abcdef0", want: ec2emu.Instance{ID: "i-0123456789abcdef0"}},
		{
			spec: "i-01234567,zone=us-east-1b,state=stopped,tag:kubernetes.io/cluster/dev=owned,tag:Name=n1",
			want: ec2emu.Instance{ID: "i-01234567", Zone: "us-east-1b", State: "stopped",
				Tags: map[string]string{"kubernetes.io/cluster/dev": "owned", "Name": "n1"}},
		},
		{spec: "i-01234567,tag:empty=", want: ec2emu.Instance{ID: "i-01234567", Tags: map[string]string{"empty": ""}}},
		{spec: "node-1", wantErr: "instance id"},
		{spec: "i-01234567,zone", wantErr: "not key=value"},
		{spec: "i-01234567,az=us-east-1a", wantErr: "unknown field"},
		{spec: "i-01234567,tag:=x", wantErr: "unknown field"},
		{spec: "i-01234567,state=gone", wantErr: "state"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := parseInstance(tt.spec)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// syncBuffer is a log sink safe for the server goroutines and the test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRunServesSeededInstances(t *testing.T) {
	urlFile := filepath.Join(t.TempDir(), "url")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--url-file", urlFile,
			"--instances", "testdata/instances.yaml", "--instance", "i-0fedcba9876543210,zone=us-east-1b"}, &logs)
	}()

	var url string
	deadline := time.Now().Add(10 * time.Second)
	for url == "" {
		if b, err := os.ReadFile(urlFile); err == nil && len(b) > 0 {
			url = strings.TrimSpace(string(b))
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned before listening: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the emulator did not write its URL")
		}
		time.Sleep(10 * time.Millisecond)
	}

	body := "Action=DescribeInstances&Version=2016-11-15"
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Amz-Date", "20260102T030405Z")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKID/20260102/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=ab")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "i-0123456789abcdef0") || !strings.Contains(string(b), "i-0fedcba9876543210") {
		t.Errorf("describe: %d\n%s", resp.StatusCode, b)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, want := range []string{"ec2 emulator listening", "action=DescribeInstances", "ec2 emulator stopped"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.String())
		}
	}
}

func TestRunRejectsBadSeeds(t *testing.T) {
	for _, args := range [][]string{
		{"--instances", "testdata/missing.yaml"},
		{"--instance", "not-an-id"},
		{"--log-level", "loud"},
		{"extra"},
	} {
		if err := run(context.Background(), append([]string{"--listen", "127.0.0.1:0"}, args...), io.Discard); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
