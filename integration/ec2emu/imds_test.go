package ec2emu

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

// imdsDo sends one raw request to instance id's metadata service.
func imdsDo(t *testing.T, s *Server, id, method, path string, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	s.IMDSHandler(id).ServeHTTP(w, r)
	return w.Code, w.Body.String(), w.Header()
}

func TestIMDSTokenFlow(t *testing.T) {
	s, clk := newTestServer(t, Config{})
	code, tok, h := imdsDo(t, s, idA, http.MethodPut, "/latest/api/token", map[string]string{imdsTTLHeader: "60"})
	if code != 200 || tok == "" || h.Get(imdsTTLHeader) != "60" {
		t.Fatalf("token: %d %q ttl=%q", code, tok, h.Get(imdsTTLHeader))
	}
	tests := []struct {
		name   string
		method string
		path   string
		hdr    map[string]string
		want   int
	}{
		{"read with token", http.MethodGet, "/latest/meta-data/instance-id", map[string]string{imdsTokenHeader: tok}, 200},
		{"read without token", http.MethodGet, "/latest/meta-data/instance-id", nil, 401},
		{"read with a wrong token", http.MethodGet, "/latest/meta-data/instance-id", map[string]string{imdsTokenHeader: "x"}, 401},
		{"token without ttl", http.MethodPut, "/latest/api/token", nil, 400},
		{"token ttl too long", http.MethodPut, "/latest/api/token", map[string]string{imdsTTLHeader: "21601"}, 400},
		{"token through a proxy", http.MethodPut, "/latest/api/token", map[string]string{imdsTTLHeader: "60", "X-Forwarded-For": "10.0.0.1"}, 403},
		{"token with GET", http.MethodGet, "/latest/api/token", map[string]string{imdsTTLHeader: "60"}, 405},
		{"no spot notice", http.MethodGet, "/latest/meta-data/spot/instance-action", map[string]string{imdsTokenHeader: tok}, 404},
		{"unknown path", http.MethodGet, "/latest/meta-data/nothing", map[string]string{imdsTokenHeader: tok}, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if code, body, _ := imdsDo(t, s, idA, tc.method, tc.path, tc.hdr); code != tc.want {
				t.Fatalf("got %d (%s), want %d", code, body, tc.want)
			}
		})
	}
	clk.Step(61 * time.Second)
	if code, _, _ := imdsDo(t, s, idA, http.MethodGet, "/latest/meta-data/instance-id", map[string]string{imdsTokenHeader: tok}); code != 401 {
		t.Fatalf("expired token: got %d, want 401", code)
	}
}

func TestIMDSModes(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	s.SetIMDSMode(idA, IMDSv1Only)
	if code, _, _ := imdsDo(t, s, idA, http.MethodPut, "/latest/api/token", map[string]string{imdsTTLHeader: "60"}); code != 404 {
		t.Fatalf("v1-only token: got %d, want 404", code)
	}
	if code, body, _ := imdsDo(t, s, idA, http.MethodGet, "/latest/meta-data/instance-id", nil); code != 200 || body != idA {
		t.Fatalf("v1-only read: %d %q", code, body)
	}
	s.SetIMDSMode(idA, IMDSDisabled)
	for _, m := range []string{http.MethodPut, http.MethodGet} {
		if code, _, _ := imdsDo(t, s, idA, m, "/latest/api/token", map[string]string{imdsTTLHeader: "60"}); code != 403 {
			t.Fatalf("disabled %s: got %d, want 403", m, code)
		}
	}
	// Hop limit: the token call never answers; the client's own timeout ends it.
	s.SetIMDSMode(idA, IMDSHopLimitExceeded)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPut, "/latest/api/token", nil)
	r.Header.Set(imdsTTLHeader, "60")
	w := httptest.NewRecorder()
	s.IMDSHandler(idA).ServeHTTP(w, r)
	// Returned only once the caller gave up, having written nothing. (Timing the call instead
	// failed under load: the deadline runs from before the handler starts.)
	if ctx.Err() == nil || w.Body.Len() > 0 {
		t.Fatalf("hop-limit token call answered before the caller's timeout: %d %q", w.Code, w.Body.String())
	}
}

// TestIMDSWithSDK drives the metadata paths through the real aws-sdk-go-v2 IMDS client (IMDSv2
// only, no fallback), scripted over time: nothing → notices → withdrawn or canceled.
func TestIMDSWithSDK(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	url, err := s.StartIMDS(idA)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	c := imds.New(imds.Options{Endpoint: url, EnableFallback: aws.FalseTernary})
	get := func(p string) (string, int) {
		t.Helper()
		out, err := c.GetMetadata(t.Context(), &imds.GetMetadataInput{Path: p})
		if err != nil {
			var se interface{ HTTPStatusCode() int }
			if errors.As(err, &se) {
				return "", se.HTTPStatusCode()
			}
			t.Fatalf("get %s: %v", p, err)
		}
		defer out.Content.Close()
		b, _ := io.ReadAll(out.Content)
		return string(b), 200
	}
	paths := []string{"spot/instance-action", "events/recommendations/rebalance", "autoscaling/target-lifecycle-state"}
	for _, p := range paths {
		if _, code := get(p); code != 404 {
			t.Fatalf("%s before any notice: %d, want 404", p, code)
		}
	}
	if body, code := get("events/maintenance/scheduled"); code != 200 || body != "[]" {
		t.Fatalf("scheduled before any event: %d %q", code, body)
	}

	at := time.Date(2026, 1, 2, 3, 6, 5, 0, time.UTC)
	s.SetSpotInstanceAction(idA, "terminate", at)
	s.SetRebalanceRecommendation(idA, epoch)
	s.SetTargetLifecycleState(idA, "Terminated")
	ev := ScheduledEvent{ID: "instance-event-0d59937288b749b32", Code: EventSystemReboot, Description: "scheduled reboot",
		NotBefore: time.Date(2019, 1, 21, 9, 0, 43, 0, time.UTC), NotAfter: time.Date(2019, 1, 21, 9, 17, 23, 0, time.UTC)}
	if err := s.AddScheduledEvent(idA, ev); err != nil {
		t.Fatal(err)
	}
	if body, _ := get("spot/instance-action"); body != `{"action":"terminate","time":"2026-01-02T03:06:05Z"}` {
		t.Errorf("spot: %s", body)
	}
	if body, _ := get("events/recommendations/rebalance"); body != `{"noticeTime":"2026-01-02T03:04:05Z"}` {
		t.Errorf("rebalance: %s", body)
	}
	if body, _ := get("autoscaling/target-lifecycle-state"); body != "Terminated" {
		t.Errorf("lifecycle: %s", body)
	}
	body, _ := get("events/maintenance/scheduled")
	var evs []map[string]string
	if err := json.Unmarshal([]byte(body), &evs); err != nil || len(evs) != 1 {
		t.Fatalf("scheduled: %s (%v)", body, err)
	}
	want := map[string]string{"NotBefore": "21 Jan 2019 09:00:43 GMT", "NotAfter": "21 Jan 2019 09:17:23 GMT",
		"Code": "system-reboot", "Description": "scheduled reboot", "EventId": ev.ID, "State": "active"}
	for k, v := range want {
		if evs[0][k] != v {
			t.Errorf("scheduled %s = %q, want %q", k, evs[0][k], v)
		}
	}
	if err := s.SetScheduledEventState(idA, ev.ID, EventStateCanceled); err != nil {
		t.Fatal(err)
	}
	s.SetSpotInstanceAction(idA, "", time.Time{})
	if _, code := get("spot/instance-action"); code != 404 {
		t.Errorf("spot after withdrawal: %d", code)
	}
	if body, _ := get("events/maintenance/scheduled"); !strings.Contains(body, `"State":"canceled"`) {
		t.Errorf("scheduled after cancel: %s", body)
	}
	if body, _ := get("events/maintenance/history"); !strings.Contains(body, ev.ID) {
		t.Errorf("history after cancel: %s", body)
	}
	if tokens, reads := s.IMDSCalls(idA); tokens != 1 || reads < 10 {
		t.Errorf("calls: %d tokens, %d reads; want one token reused by every read", tokens, reads)
	}
}

func TestScheduledEventValidation(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	good := ScheduledEvent{ID: "instance-event-0123456789abcdef0", Code: EventInstanceStop, NotBefore: epoch}
	tests := []struct {
		name string
		mod  func(*ScheduledEvent)
		want string
	}{
		{"bad id", func(e *ScheduledEvent) { e.ID = "ev-1" }, "event id"},
		{"bad code", func(e *ScheduledEvent) { e.Code = "reboot" }, "not an EC2 scheduled event code"},
		{"bad state", func(e *ScheduledEvent) { e.State = "done" }, "not active, canceled or completed"},
		{"no start", func(e *ScheduledEvent) { e.NotBefore = time.Time{} }, "NotBefore is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := good
			tc.mod(&ev)
			err := s.AddScheduledEvent(idA, ev)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	if err := s.AddScheduledEvent(idUnknown, good); err == nil {
		t.Fatal("event of an unknown instance accepted")
	}
}

// TestIMDSInstanceLifeCycle: instance-life-cycle follows the instance's Lifecycle (on-demand
// when empty), and reads are counted per path.
func TestIMDSInstanceLifeCycle(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	const spotID = "i-0aaaaaaaaaaaaaaa1"
	if err := s.AddInstance(Instance{ID: spotID, Lifecycle: LifecycleSpot}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{idA: "on-demand", spotID: "spot"} {
		s.SetIMDSMode(id, IMDSv1Only) // no token needed for this raw read
		if code, body, _ := imdsDo(t, s, id, http.MethodGet, "/latest/meta-data/instance-life-cycle", nil); code != 200 || body != want {
			t.Errorf("%s: got %d %q, want %q", id, code, body, want)
		}
		imdsDo(t, s, id, http.MethodGet, "/latest/meta-data/spot/instance-action", nil)
		if got := s.IMDSPathReads(id, "instance-life-cycle"); got != 1 {
			t.Errorf("%s: %d reads of instance-life-cycle counted, want 1", id, got)
		}
		if got := s.IMDSPathReads(id, "spot/instance-action"); got != 1 {
			t.Errorf("%s: %d reads of spot/instance-action counted, want 1", id, got)
		}
	}
}
