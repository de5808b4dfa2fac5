package imds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// TestFailuresAgainstTheEmulator reads the spot path through the real SDK client in each of
// the emulator's fault modes and checks the cause and the fix named.
func TestFailuresAgainstTheEmulator(t *testing.T) {
	tests := []struct {
		name    string
		script  func(*ec2emu.Server)
		after   func(*ec2emu.Server) // applied after a first, healthy read
		reason  string
		message []string
	}{
		{"endpoint disabled", func(s *ec2emu.Server) { s.SetIMDSMode(instanceID, ec2emu.IMDSDisabled) }, nil,
			ReasonIMDSDisabled, []string{"session token (403)", "--http-endpoint enabled"}},
		{"disabled after the token was issued", nil, func(s *ec2emu.Server) { s.SetIMDSMode(instanceID, ec2emu.IMDSDisabled) },
			ReasonIMDSDisabled, []string{"a read (403)", "--http-endpoint enabled"}},
		{"IMDSv1 only", func(s *ec2emu.Server) { s.SetIMDSMode(instanceID, ec2emu.IMDSv1Only) }, nil,
			ReasonIMDSv1Only, []string{"no IMDSv2 token endpoint (404)", "hostNetwork: true"}},
		{"hop limit", func(s *ec2emu.Server) { s.SetIMDSMode(instanceID, ec2emu.IMDSHopLimitExceeded) }, nil,
			ReasonIMDSHopLimit, []string{"never arrived", "--http-put-response-hop-limit 2", "hostNetwork: true"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, url, clk := emulated(t, ec2emu.LifecycleSpot)
			if tc.script != nil {
				tc.script(s)
			}
			w := newWatcher(t, Config{Endpoint: url, OneShot: true, Clock: clk, Timeout: 500 * time.Millisecond})
			if tc.after != nil {
				if r := check(t, w, collectors.CheckSpotInterruption); r.Reason != ReasonNoEvent {
					t.Fatalf("first read: %s/%s (%s)", r.Status, r.Reason, r.Message)
				}
				tc.after(s)
			}
			r := check(t, w, collectors.CheckSpotInterruption)
			if r.Status != collectors.StatusUnknown || r.Reason != tc.reason {
				t.Fatalf("got %s/%s (%s), want Unknown/%s", r.Status, r.Reason, r.Message, tc.reason)
			}
			for _, m := range tc.message {
				if !strings.Contains(r.Message, m) {
					t.Errorf("message %q lacks %q", r.Message, m)
				}
			}
			if r.Err == nil {
				t.Error("no error kept with the result")
			}
		})
	}
}

func TestRefusedAndDisabledByEnvironment(t *testing.T) {
	hs := httptest.NewServer(nil)
	url := hs.URL
	hs.Close() // nothing listens there any more
	w := newWatcher(t, Config{Endpoint: url, OneShot: true})
	r := check(t, w, collectors.CheckScheduledEvents)
	if r.Reason != ReasonIMDSUnreachable || !strings.Contains(r.Message, "connection refused") || !strings.Contains(r.Message, "hostNetwork") {
		t.Errorf("refused: %s/%s (%s)", r.Status, r.Reason, r.Message)
	}
	t.Setenv(envMetadataDisabled, "true")
	w = newWatcher(t, Config{Endpoint: url, OneShot: true})
	r = check(t, w, collectors.CheckScheduledEvents)
	if r.Reason != ReasonIMDSDisabled || !strings.Contains(r.Message, envMetadataDisabled+"=true") {
		t.Errorf("disabled by environment: %s/%s (%s)", r.Status, r.Reason, r.Message)
	}
}

// TestClassifyReadsTypesNotText: the cause comes from statuses and error types; the errors'
// text is deliberately meaningless here.
func TestClassifyReadsTypesNotText(t *testing.T) {
	opaque := errors.New("operation error ec2imds: GetMetadata, something else entirely")
	refused := fmt.Errorf("wrapped: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	deadline := fmt.Errorf("wrapped: %w", context.DeadlineExceeded)
	tests := []struct {
		name   string
		err    error
		tr     tracker
		reason string
		status int
		text   string
	}{
		{"token 403", opaque, tracker{tokenErr: opaque, tokenStatus: 403}, ReasonIMDSDisabled, 0, "session token (403)"},
		{"token 404", opaque, tracker{tokenErr: opaque, tokenStatus: 404}, ReasonIMDSv1Only, 0, "(404)"},
		{"token 405", opaque, tracker{tokenErr: opaque, tokenStatus: 405}, ReasonIMDSv1Only, 0, "(405)"},
		{"token 500", opaque, tracker{tokenErr: opaque, tokenStatus: 500}, ReasonIMDSError, 0, "with 500"},
		{"token timeout after connecting", opaque, tracker{tokenErr: deadline, connected: true}, ReasonIMDSHopLimit, 0, "HttpPutResponseHopLimit=1"},
		{"token timeout without a connection", opaque, tracker{tokenErr: deadline}, ReasonIMDSUnreachable, 0, "no answer in time"},
		{"token refused", opaque, tracker{tokenErr: refused}, ReasonIMDSUnreachable, 0, "connection refused"},
		{"read 404", opaque, tracker{status: 404}, "", 404, ""},
		{"read 401", opaque, tracker{status: 401}, ReasonIMDSError, 401, "(401)"},
		{"read 403", opaque, tracker{status: 403}, ReasonIMDSDisabled, 403, "a read (403)"},
		{"read 503", opaque, tracker{status: 503}, ReasonIMDSError, 503, "answered 503"},
		{"read refused", refused, tracker{}, ReasonIMDSUnreachable, 0, "connection refused"},
		{"read timeout", deadline, tracker{connected: true}, ReasonIMDSUnreachable, 0, "no answer in time"},
	}
	w := newWatcher(t, Config{Endpoint: "http://192.0.2.1"})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := w.classify(tc.err, &tc.tr)
			if f.reason != tc.reason || f.status != tc.status || !strings.Contains(f.message, tc.text) {
				t.Errorf("got %+v, want reason %q status %d and %q in the message", f, tc.reason, tc.status, tc.text)
			}
		})
	}
}

// TestNoReadWithoutAToken: IMDSv2 only. Where no session token can be had (an IMDSv1-only
// proxy), no metadata path is read at all, not even once as a fallback.
func TestNoReadWithoutAToken(t *testing.T) {
	s, url, clk := emulated(t, ec2emu.LifecycleSpot)
	s.SetIMDSMode(instanceID, ec2emu.IMDSv1Only)
	w := newWatcher(t, Config{Endpoint: url, OneShot: true, Clock: clk})
	if r := check(t, w, collectors.CheckSpotInterruption); r.Reason != ReasonIMDSv1Only {
		t.Fatalf("got %s/%s (%s), want Unknown/%s", r.Status, r.Reason, r.Message, ReasonIMDSv1Only)
	}
	if tokens, reads := s.IMDSCalls(instanceID); tokens == 0 || reads != 0 {
		t.Errorf("%d token requests, %d metadata reads; want at least one token request and no read", tokens, reads)
	}
}
