package ec2emu

import (
	"bytes"
	"context"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const (
	idA = "i-0123456789abcdef0"
	idB = "i-0fedcba9876543210"
	idC = "i-01234567"
	// idUnknown is well-formed but never added.
	idUnknown = "i-0aaaaaaaaaaaaaaaa"
	tagKey    = "kubernetes.io/cluster/test"
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newTestServer(t testing.TB, cfg Config) (*Server, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	if cfg.Clock == nil {
		cfg.Clock = clk
	}
	s := New(cfg)
	for _, in := range []Instance{
		{ID: idA, Zone: "us-east-1a", Tags: map[string]string{tagKey: "owned", "Name": "node-a"}},
		{ID: idB, Zone: "us-east-1b", Tags: map[string]string{tagKey: "shared"}},
		{ID: idC, Zone: "us-east-1c", State: StateStopped},
	} {
		if err := s.AddInstance(in); err != nil {
			t.Fatal(err)
		}
	}
	return s, clk
}

func form(action string, ids ...string) url.Values {
	v := url.Values{"Action": {action}, "Version": {"2016-11-15"}}
	for i, id := range ids {
		v.Set("InstanceId."+strconv.Itoa(i+1), id)
	}
	return v
}

// sign adds the headers a SigV4-signing client sends; the emulator checks their presence and
// scope, not the signature.
func sign(r *http.Request) {
	r.Header.Set("X-Amz-Date", "20260102T030405Z")
	r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260102/us-east-1/ec2/aws4_request, "+
		"SignedHeaders=content-type;host;x-amz-date, Signature=0123456789abcdef")
}

// do sends a signed form-encoded POST to h and returns the status and body.
func do(t testing.TB, h http.Handler, v url.Values) (int, []byte) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(v.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	sign(r)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.Bytes()
}

func decodeError(t testing.TB, body []byte) errorResponse {
	t.Helper()
	var e errorResponse
	if err := xml.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body is not an error envelope: %v\n%s", err, body)
	}
	if len(e.Errors) != 1 || e.RequestID == "" {
		t.Fatalf("error envelope wants one error and a RequestID, got %+v", e)
	}
	return e
}

func errorCode(t testing.TB, body []byte) string {
	t.Helper()
	return decodeError(t, body).Errors[0].Code
}

// describeIDs sends DescribeInstances and returns the IDs and states in the answer.
func describeIDs(t testing.TB, h http.Handler, v url.Values) (ids []string, states map[string]string, next string) {
	t.Helper()
	code, body := do(t, h, v)
	if code != http.StatusOK {
		t.Fatalf("DescribeInstances: status %d: %s", code, body)
	}
	var resp describeInstancesResponse
	if err := xml.Unmarshal(body, &resp); err != nil {
		t.Fatalf("decode: %v", err)
	}
	states = map[string]string{}
	for _, r := range resp.ReservationSet.Items {
		for _, in := range r.InstancesSet.Items {
			ids = append(ids, in.InstanceID)
			states[in.InstanceID] = in.InstanceState.Name
		}
	}
	return ids, states, resp.NextToken
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run with -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the response:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// The response documents are compared byte for byte with reviewed golden files whose shape
// follows the examples of the EC2 API reference, so a change of element names or nesting is
// caught here and not only when the SDK fails to read it.
func TestResponseShapes(t *testing.T) {
	s, _ := newTestServer(t, Config{})

	code, body := do(t, s, form(ActionDescribeInstances, idA, idC))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	golden(t, "describe_instances.xml", body)

	code, body = do(t, s, form(ActionTerminateInstances, idA))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	golden(t, "terminate_instances.xml", body)

	code, body = do(t, s, form(ActionTerminateInstances, idUnknown))
	if code != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", code)
	}
	golden(t, "error_not_found.xml", body)
}

func TestRequestValidation(t *testing.T) {
	tests := []struct {
		name     string
		form     url.Values
		wantCode int
		wantErr  string
	}{
		{"missing action", url.Values{"Version": {"2016-11-15"}}, 400, "MissingAction"},
		{"missing version", url.Values{"Action": {ActionDescribeInstances}}, 400, "MissingParameter"},
		{"unknown action", form("RunInstances"), 400, "InvalidAction"},
		{"terminate without ids", form(ActionTerminateInstances), 400, "MissingParameter"},
		{"malformed id", form(ActionDescribeInstances, idA, "i-xyz"), 400, "InvalidInstanceID.Malformed"},
		{"malformed index", url.Values{"Action": {ActionDescribeInstances}, "Version": {"2016-11-15"}, "InstanceId.x": {idA}}, 400, "InvalidParameterValue"},
		{"unknown filter", url.Values{"Action": {ActionDescribeInstances}, "Version": {"2016-11-15"},
			"Filter.1.Name": {"vpc-id"}, "Filter.1.Value.1": {"vpc-1"}}, 400, "InvalidParameterValue"},
		{"filter without name", url.Values{"Action": {ActionDescribeInstances}, "Version": {"2016-11-15"},
			"Filter.1.Value.1": {"x"}}, 400, "MissingParameter"},
		{"max results out of range", url.Values{"Action": {ActionDescribeInstances}, "Version": {"2016-11-15"},
			"MaxResults": {"1001"}}, 400, "InvalidParameterValue"},
		{"max results with ids", func() url.Values {
			v := form(ActionDescribeInstances, idA)
			v.Set("MaxResults", "5")
			return v
		}(), 400, "InvalidParameterCombination"},
		{"bad next token", url.Values{"Action": {ActionDescribeInstances}, "Version": {"2016-11-15"},
			"NextToken": {"not-a-token"}}, 400, "InvalidPaginationToken"},
		{"dry run", func() url.Values {
			v := form(ActionTerminateInstances, idA)
			v.Set("DryRun", "true")
			return v
		}(), 412, "DryRunOperation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newTestServer(t, Config{})
			code, body := do(t, s, tt.form)
			if code != tt.wantCode {
				t.Errorf("status %d, want %d: %s", code, tt.wantCode, body)
			}
			if got := errorCode(t, body); got != tt.wantErr {
				t.Errorf("code %s, want %s", got, tt.wantErr)
			}
			if got := s.TerminateCalls(); len(got) != 0 {
				t.Errorf("a refused call terminated %v", got)
			}
			if inst, _ := s.Instance(idA); inst.State != StateRunning {
				t.Errorf("a refused call changed %s to %s", idA, inst.State)
			}
		})
	}
}

func TestSignatureRequired(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	body := form(ActionDescribeInstances).Encode()
	tests := []struct {
		name      string
		auth      string
		date      string
		wantCode  int
		wantInMsg string
	}{
		{"unsigned", "", "", 401, "not signed"},
		{"sigv2", "AWS AKID:sig", "20260102T030405Z", 401, "AWS4-HMAC-SHA256"},
		{"no signature", "AWS4-HMAC-SHA256 Credential=AKID/20260102/us-east-1/ec2/aws4_request, SignedHeaders=host", "20260102T030405Z", 401, "Signature"},
		{"no date", "AWS4-HMAC-SHA256 Credential=AKID/20260102/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=ab", "", 401, "X-Amz-Date"},
		{"other service", "AWS4-HMAC-SHA256 Credential=AKID/20260102/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=ab", "20260102T030405Z", 401, "not ec2"},
		{"signed", "AWS4-HMAC-SHA256 Credential=AKID/20260102/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=ab", "20260102T030405Z", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			if tt.date != "" {
				r.Header.Set("X-Amz-Date", tt.date)
			}
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			if w.Code != tt.wantCode {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.wantCode, w.Body)
			}
			if tt.wantCode == 200 {
				return
			}
			e := decodeError(t, w.Body.Bytes())
			if e.Errors[0].Code != "AuthFailure" || !strings.Contains(e.Errors[0].Message, tt.wantInMsg) {
				t.Errorf("got %+v, want AuthFailure mentioning %q", e.Errors[0], tt.wantInMsg)
			}
		})
	}
}

func TestGetQueryAndPresignedURL(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	v := form(ActionDescribeInstances, idB)
	v.Set("X-Amz-Algorithm", "AWS4-HMAC-SHA256")
	v.Set("X-Amz-Credential", "AKID/20260102/us-east-1/ec2/aws4_request")
	v.Set("X-Amz-Signature", "abc")
	r := httptest.NewRequest(http.MethodGet, "/?"+v.Encode(), nil)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var resp describeInstancesResponse
	if err := xml.Unmarshal(w.Body.Bytes(), &resp); err != nil {
		t.Fatal(err)
	}
	if n := len(resp.ReservationSet.Items); n != 1 || resp.ReservationSet.Items[0].InstancesSet.Items[0].InstanceID != idB {
		t.Errorf("GET describe of %s returned %+v", idB, resp.ReservationSet)
	}
}

func TestDescribeFilters(t *testing.T) {
	filterForm := func(kv ...string) url.Values {
		v := form(ActionDescribeInstances)
		for i := 0; i < len(kv); i += 2 {
			n := i/2 + 1
			v.Set(fmt.Sprintf("Filter.%d.Name", n), kv[i])
			for j, val := range strings.Split(kv[i+1], "|") {
				v.Set(fmt.Sprintf("Filter.%d.Value.%d", n, j+1), val)
			}
		}
		return v
	}
	tests := []struct {
		name string
		form url.Values
		want []string
	}{
		{"no filter lists all in order", form(ActionDescribeInstances), []string{idA, idB, idC}},
		{"instance-id", filterForm("instance-id", idB), []string{idB}},
		{"instance-id values are ORed", filterForm("instance-id", idA+"|"+idC), []string{idA, idC}},
		{"instance-id wildcard", filterForm("instance-id", "i-0123*"), []string{idA, idC}},
		{"instance-state-name", filterForm("instance-state-name", "stopped"), []string{idC}},
		{"tag value", filterForm("tag:"+tagKey, "owned"), []string{idA}},
		{"tag value any of", filterForm("tag:"+tagKey, "owned|shared"), []string{idA, idB}},
		{"tag-key", filterForm("tag-key", tagKey), []string{idA, idB}},
		{"tag-key wildcard", filterForm("tag-key", "kubernetes.io/cluster/*"), []string{idA, idB}},
		{"filters are ANDed", filterForm("tag-key", tagKey, "instance-state-name", "running", "availability-zone", "us-east-1b"), []string{idB}},
		{"ids and filters combine", func() url.Values {
			v := filterForm("tag-key", tagKey)
			v.Set("InstanceId.1", idA)
			v.Set("InstanceId.2", idC)
			return v
		}(), []string{idA}},
		{"no match", filterForm("tag:Name", "node-z"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newTestServer(t, Config{})
			got, _, _ := describeIDs(t, s, tt.form)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDescribePagination(t *testing.T) {
	s := New(Config{Clock: clocktesting.NewFakeClock(epoch)})
	var all []string
	for i := 0; i < 12; i++ {
		id := fmt.Sprintf("i-%017x", i+1)
		all = append(all, id)
		if err := s.AddInstance(Instance{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	token := ""
	pages := 0
	for {
		v := form(ActionDescribeInstances)
		v.Set("MaxResults", "5")
		if token != "" {
			v.Set("NextToken", token)
		}
		ids, _, next := describeIDs(t, s, v)
		pages++
		got = append(got, ids...)
		if next == "" {
			break
		}
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
		token = next
	}
	if pages != 3 || !reflect.DeepEqual(got, all) {
		t.Errorf("got %d pages with %v, want 3 pages with %v", pages, got, all)
	}
}

func TestUnknownIDsFailTheWholeCall(t *testing.T) {
	tests := []struct {
		name    string
		action  string
		ids     []string
		wantErr string
		wantMsg string
	}{
		{"describe one unknown", ActionDescribeInstances, []string{idA, idUnknown}, "InvalidInstanceID.NotFound", "The instance ID '" + idUnknown + "' does not exist"},
		{"describe two unknown", ActionDescribeInstances, []string{idUnknown, idA, "i-0bbbbbbbbbbbbbbbb"}, "InvalidInstanceID.NotFound", "'" + idUnknown + ", i-0bbbbbbbbbbbbbbbb' do not exist"},
		{"terminate unknown", ActionTerminateInstances, []string{idA, idUnknown}, "InvalidInstanceID.NotFound", idUnknown},
		{"terminate malformed", ActionTerminateInstances, []string{idA, "i-ABC"}, "InvalidInstanceID.Malformed", `"i-ABC"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newTestServer(t, Config{})
			code, body := do(t, s, form(tt.action, tt.ids...))
			if code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", code)
			}
			e := decodeError(t, body).Errors[0]
			if e.Code != tt.wantErr || !strings.Contains(e.Message, tt.wantMsg) {
				t.Errorf("got %+v, want %s containing %q", e, tt.wantErr, tt.wantMsg)
			}
			if inst, _ := s.Instance(idA); inst.State != StateRunning || s.Terminations(idA) != 0 {
				t.Errorf("the known instance was terminated by a failed call: %+v", inst)
			}
		})
	}
}

func TestTerminateLifecycle(t *testing.T) {
	s, clk := newTestServer(t, Config{ShutdownDelay: time.Minute})
	terminate := func(ids ...string) map[string][2]string {
		t.Helper()
		code, body := do(t, s, form(ActionTerminateInstances, ids...))
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, body)
		}
		var resp terminateInstancesResponse
		if err := xml.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		out := map[string][2]string{}
		for _, c := range resp.InstancesSet.Items {
			if c.PreviousState.Code != stateCodes[c.PreviousState.Name] || c.CurrentState.Code != stateCodes[c.CurrentState.Name] {
				t.Errorf("state codes do not match names: %+v", c)
			}
			out[c.InstanceID] = [2]string{c.PreviousState.Name, c.CurrentState.Name}
		}
		return out
	}

	got := terminate(idA, idC)
	want := map[string][2]string{idA: {StateRunning, StateShuttingDown}, idC: {StateStopped, StateShuttingDown}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("first terminate: got %v, want %v", got, want)
	}
	clk.Step(59 * time.Second)
	if got := terminate(idA); got[idA] != [2]string{StateShuttingDown, StateShuttingDown} {
		t.Errorf("terminate while shutting down: got %v", got[idA])
	}
	clk.Step(time.Second)
	if in, _ := s.Instance(idA); in.State != StateTerminated {
		t.Errorf("after the shutdown delay: state %s, want terminated", in.State)
	}
	if got := terminate(idA); got[idA] != [2]string{StateTerminated, StateTerminated} {
		t.Errorf("terminate when terminated: got %v", got[idA])
	}
	_, states, _ := describeIDs(t, s, form(ActionDescribeInstances, idA, idB))
	if states[idA] != StateTerminated || states[idB] != StateRunning {
		t.Errorf("describe after terminate: %v", states)
	}
	wantCalls := [][]string{{idA, idC}, {idA}, {idA}}
	if got := s.TerminateCalls(); !reflect.DeepEqual(got, wantCalls) {
		t.Errorf("TerminateCalls() = %v, want %v", got, wantCalls)
	}
	if s.Terminations(idA) != 3 || s.Terminations(idC) != 1 || s.Terminations(idB) != 0 {
		t.Errorf("Terminations: a=%d c=%d b=%d", s.Terminations(idA), s.Terminations(idC), s.Terminations(idB))
	}
	if s.Calls(ActionTerminateInstances) != 3 || s.Calls(ActionDescribeInstances) != 1 || s.Calls("") != 4 {
		t.Errorf("Calls: terminate=%d describe=%d total=%d", s.Calls(ActionTerminateInstances), s.Calls(ActionDescribeInstances), s.Calls(""))
	}
}

func TestTerminateLimit(t *testing.T) {
	s := New(Config{})
	ids := make([]string, MaxTerminateIDs+1)
	for i := range ids {
		ids[i] = fmt.Sprintf("i-%017x", i+1)
		if err := s.AddInstance(Instance{ID: ids[i]}); err != nil {
			t.Fatal(err)
		}
	}
	code, body := do(t, s, form(ActionTerminateInstances, ids...))
	if code != 400 || errorCode(t, body) != "InvalidParameterValue" {
		t.Errorf("1001 ids: status %d %s", code, body)
	}
	code, body = do(t, s, form(ActionTerminateInstances, ids[:MaxTerminateIDs]...))
	if code != 200 {
		t.Errorf("1000 ids: status %d %s", code, body)
	}
}

func TestThrottle(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	s.Throttle(ActionTerminateInstances, 2)
	for i, want := range []int{503, 503, 200} {
		code, body := do(t, s, form(ActionTerminateInstances, idA))
		if code != want {
			t.Fatalf("terminate call %d: status %d, want %d: %s", i+1, code, want, body)
		}
		if code == 503 && errorCode(t, body) != "RequestLimitExceeded" {
			t.Errorf("call %d: code %s", i+1, errorCode(t, body))
		}
	}
	if code, _ := do(t, s, form(ActionDescribeInstances)); code != 200 {
		t.Errorf("throttling TerminateInstances throttled DescribeInstances: %d", code)
	}

	s.Throttle("", -1)
	for i := 0; i < 5; i++ {
		if code, _ := do(t, s, form(ActionDescribeInstances)); code != 503 {
			t.Fatalf("forever throttle let call %d through (%d)", i, code)
		}
	}
	s.Throttle("", 0)
	if code, _ := do(t, s, form(ActionDescribeInstances)); code != 200 {
		t.Errorf("cleared throttle still throttles: %d", code)
	}
	if got := s.TerminateCalls(); len(got) != 1 {
		t.Errorf("throttled calls were carried out: %v", got)
	}
}

func TestUnauthorized(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	s.SetUnauthorized(ActionTerminateInstances, true)
	code, body := do(t, s, form(ActionTerminateInstances, idA))
	if code != http.StatusForbidden || errorCode(t, body) != "UnauthorizedOperation" {
		t.Errorf("got %d %s, want 403 UnauthorizedOperation", code, body)
	}
	if code, _ := do(t, s, form(ActionDescribeInstances, idA)); code != 200 {
		t.Errorf("describe refused too: %d", code)
	}
	s.SetUnauthorized(ActionTerminateInstances, false)
	if code, _ := do(t, s, form(ActionTerminateInstances, idA)); code != 200 {
		t.Errorf("switching the fault off did not restore: %d", code)
	}
	if n := s.Terminations(idA); n != 1 {
		t.Errorf("Terminations = %d, want 1", n)
	}
}

func TestNotFoundAfterTerminate(t *testing.T) {
	t.Run("window", func(t *testing.T) {
		s, clk := newTestServer(t, Config{NotFoundFor: 30 * time.Second, ShutdownDelay: time.Minute})
		s.SetNotFoundAfterTerminate(true)
		if code, body := do(t, s, form(ActionTerminateInstances, idA)); code != 200 {
			t.Fatalf("terminate: %d %s", code, body)
		}
		code, body := do(t, s, form(ActionDescribeInstances, idA))
		if code != 400 || errorCode(t, body) != "InvalidInstanceID.NotFound" {
			t.Errorf("describe right after terminate: %d %s, want NotFound", code, body)
		}
		if ids, _, _ := describeIDs(t, s, form(ActionDescribeInstances)); !reflect.DeepEqual(ids, []string{idB, idC}) {
			t.Errorf("listing = %v, want the hidden instance left out", ids)
		}
		if in, ok := s.Instance(idA); !ok || in.State != StateShuttingDown {
			t.Errorf("the hidden instance is really %+v, want shutting-down", in)
		}
		clk.Step(30 * time.Second)
		if _, states, _ := describeIDs(t, s, form(ActionDescribeInstances, idA)); states[idA] != StateShuttingDown {
			t.Errorf("after the window: %v", states)
		}
	})
	t.Run("until switched off", func(t *testing.T) {
		s, clk := newTestServer(t, Config{})
		s.SetNotFoundAfterTerminate(true)
		do(t, s, form(ActionTerminateInstances, idB))
		clk.Step(time.Hour)
		if code, _ := do(t, s, form(ActionTerminateInstances, idB)); code != 400 {
			t.Errorf("second terminate of a hidden instance: %d, want 400", code)
		}
		s.SetNotFoundAfterTerminate(false)
		if _, states, _ := describeIDs(t, s, form(ActionDescribeInstances, idB)); states[idB] != StateTerminated {
			t.Errorf("after switching off: %v", states)
		}
		if n := s.Terminations(idB); n != 1 {
			t.Errorf("Terminations = %d, want 1", n)
		}
	})
}

func TestHideInstance(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	s.HideInstance(idA, ActionTerminateInstances, true)
	if code, _ := do(t, s, form(ActionDescribeInstances, idA)); code != 200 {
		t.Errorf("describe of an instance hidden from terminate: %d", code)
	}
	if code, body := do(t, s, form(ActionTerminateInstances, idA)); code != 400 || errorCode(t, body) != "InvalidInstanceID.NotFound" {
		t.Errorf("terminate of a hidden instance: %d %s", code, body)
	}
	s.HideInstance(idA, ActionTerminateInstances, false)
	if code, _ := do(t, s, form(ActionTerminateInstances, idA)); code != 200 {
		t.Errorf("unhidden: %d", code)
	}
}

func TestLatency(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	s.SetLatency(50 * time.Millisecond)
	start := time.Now()
	do(t, s, form(ActionDescribeInstances))
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("call took %v, want at least the 50ms latency", d)
	}

	// A caller that gives up is not kept waiting.
	s.SetLatency(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(form(ActionTerminateInstances, idA).Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	sign(r)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ServeHTTP(httptest.NewRecorder(), r)
	}()
	cancel()
	<-done
	if n := s.Terminations(idA); n != 0 {
		t.Errorf("a cancelled call terminated the instance")
	}
}

// Faults are switched while calls are in flight; run with -race.
func TestConcurrentUse(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	srv := httptest.NewServer(s)
	defer srv.Close()
	const workers, calls = 8, 25
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < calls; i++ {
				v := form(ActionDescribeInstances, idA)
				if i%2 == 1 {
					v = form(ActionTerminateInstances, idB)
				}
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(v.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				sign(req)
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch w {
				case 0:
					s.Throttle("", 1)
				case 1:
					s.SetUnauthorized(ActionDescribeInstances, i%3 == 0)
				case 2:
					s.SetNotFoundAfterTerminate(i%4 == 0)
				}
				_ = s.TerminateCalls()
				_, _ = s.Instance(idB)
			}
		}(w)
	}
	wg.Wait()
	if got := s.Calls(""); got != workers*calls {
		t.Errorf("Calls(\"\") = %d, want %d", got, workers*calls)
	}
	if got, sum := s.Calls(ActionDescribeInstances)+s.Calls(ActionTerminateInstances), workers*calls; got != sum {
		t.Errorf("per-action calls add up to %d, want %d", got, sum)
	}
}

func TestStartAndClose(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	if s.URL() != "" {
		t.Errorf("URL before Start = %q", s.URL())
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	u := s.URL()
	if !strings.HasPrefix(u, "http://127.0.0.1:") {
		t.Fatalf("URL = %q", u)
	}
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form(ActionDescribeInstances).Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	sign(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/xml;charset=UTF-8" {
		t.Errorf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Error("server still answers after Close")
	}
}

func TestAddInstanceValidates(t *testing.T) {
	s := New(Config{})
	for _, in := range []Instance{{ID: "i-123"}, {ID: "0123456789abcdef0"}, {ID: idA, State: "exploded"}} {
		if err := s.AddInstance(in); err == nil {
			t.Errorf("AddInstance(%+v) succeeded", in)
		}
	}
	if err := s.AddInstance(Instance{ID: idA}); err != nil {
		t.Fatal(err)
	}
	in, _ := s.Instance(idA)
	if in.State != StateRunning || in.Zone != defaultZone {
		t.Errorf("defaults not applied: %+v", in)
	}
}
