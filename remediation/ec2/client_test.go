package ec2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"sort"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

const (
	clusterTag = "kubernetes.io/cluster/test"
	idOwned    = "i-0000000000000000a"
	idShared   = "i-0000000000000000b"
	idForeign  = "i-0000000000000000c"
	idEmptyTag = "i-0000000000000000d"
	idOld      = "i-0000000e" // the 8-digit form, a prefix of nothing here but worth covering
	idDone     = "i-0000000000000000f"
	idUnknown  = "i-0123456789abcdef0"
)

// TestMain pins the SDK's default chain to static credentials and nothing else, so the tests
// neither read the developer's ~/.aws nor try the instance metadata service.
func TestMain(m *testing.M) {
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           "AKIDNODEVIGILTEST",
		"AWS_SECRET_ACCESS_KEY":       "secret",
		"AWS_CONFIG_FILE":             os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
		"AWS_EC2_METADATA_DISABLED":   "true",
	} {
		os.Setenv(k, v)
	}
	for _, k := range []string{"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
		"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_CA_BUNDLE"} {
		os.Unsetenv(k)
	}
	os.Exit(m.Run())
}

// fixture is an emulator behind a real HTTP listener and a Client talking to it through the
// real SDK.
type fixture struct {
	emu    *ec2emu.Server
	clock  *clocktesting.FakeClock
	srv    *httptest.Server
	client *Client
	reg    *prometheus.Registry
}

func newFixture(t testing.TB, cfg Config) *fixture {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	emu := ec2emu.New(ec2emu.Config{Clock: clk, ShutdownDelay: time.Minute})
	for _, in := range []ec2emu.Instance{
		{ID: idOwned, Zone: "us-east-1a", Tags: map[string]string{clusterTag: "owned", "Name": "a"}},
		{ID: idShared, Zone: "us-east-1b", Tags: map[string]string{clusterTag: "shared"}, Lifecycle: ec2emu.LifecycleSpot},
		{ID: idForeign, Zone: "us-east-1a", Tags: map[string]string{"kubernetes.io/cluster/other": "owned"}},
		{ID: idEmptyTag, Zone: "us-east-1a", Tags: map[string]string{clusterTag: ""}},
		{ID: idOld, Zone: "us-east-1c", Tags: map[string]string{clusterTag: "owned"}},
		{ID: idDone, Zone: "us-east-1c", State: ec2emu.StateTerminated, Tags: map[string]string{clusterTag: "owned"}},
	} {
		if err := emu.AddInstance(in); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(emu)
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = srv.URL
	}
	if cfg.ClusterTagKey == "" {
		cfg.ClusterTagKey = clusterTag
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = time.Millisecond // keep retried tests fast; the policy is the SDK's
	}
	cfg.Registerer = reg
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{emu: emu, clock: clk, srv: srv, client: c, reg: reg}
}

// addOwned adds n running, owned instances and returns their IDs.
func (f *fixture) addOwned(t testing.TB, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("i-1%016x", i)
		if err := f.emu.AddInstance(ec2emu.Instance{ID: ids[i], Tags: map[string]string{clusterTag: "owned"}}); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// metric returns the value of a counter, or the sample count of a histogram, with the labels.
func (f *fixture) metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
	next:
		for _, m := range fam.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return 0
}

func TestThrottleCodeIsRetriedByStandardRetryer(t *testing.T) {
	if _, ok := retry.DefaultThrottleErrorCodes[codeThrottled]; !ok {
		t.Fatalf("%s is no longer in retry.DefaultThrottleErrorCodes: add it through retry.StandardOptions.Retryables", codeThrottled)
	}
	err := &smithy.GenericAPIError{Code: codeThrottled}
	if retry.NewStandard().IsErrorRetryable(err) != true {
		t.Errorf("the standard retryer does not retry %s", codeThrottled)
	}
	for _, code := range []string{codeUnauthorized, codeNotFound, codeMalformed} {
		if retry.NewStandard().IsErrorRetryable(&smithy.GenericAPIError{Code: code}) {
			t.Errorf("the standard retryer retries %s, which can never succeed", code)
		}
	}
}

func TestNewValidatesConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no tag key", Config{Region: "us-east-1"}, "ClusterTagKey"},
		{"no region", Config{ClusterTagKey: clusterTag}, "region"},
		{"bad endpoint", Config{Region: "us-east-1", ClusterTagKey: clusterTag, Endpoint: "localhost:8080"}, "Endpoint"},
		{"negative attempts", Config{Region: "us-east-1", ClusterTagKey: clusterTag, MaxAttempts: -1}, "MaxAttempts"},
		{"empty tag values", Config{Region: "us-east-1", ClusterTagKey: clusterTag, ClusterTagValues: []string{}}, "ClusterTagValues"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(context.Background(), tt.cfg)
			if err == nil || !regexp.MustCompile(tt.want).MatchString(err.Error()) {
				t.Errorf("New() error = %v, want one naming %s", err, tt.want)
			}
		})
	}
}

func TestEndpointFromEnvironment(t *testing.T) {
	f := newFixture(t, Config{})
	t.Setenv("AWS_ENDPOINT_URL_EC2", f.srv.URL)
	c, err := New(context.Background(), Config{Region: "us-east-1", ClusterTagKey: clusterTag})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Describe(context.Background(), []string{idOwned})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[idOwned]; !ok || f.emu.Calls(ec2emu.ActionDescribeInstances) != 1 {
		t.Errorf("AWS_ENDPOINT_URL_EC2 not honoured: %v, %d calls", got, f.emu.Calls(ec2emu.ActionDescribeInstances))
	}
}

func TestDescribe(t *testing.T) {
	f := newFixture(t, Config{})
	ids := []string{idOwned, idUnknown, idShared, "i-0aaaaaaaaaaaaaaaa", idForeign, idEmptyTag, idOld, idDone, "not-an-id", idOwned}
	got, err := f.client.Describe(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Instance{
		idOwned:    {ID: idOwned, State: "running", Zone: "us-east-1a", Tags: map[string]string{clusterTag: "owned", "Name": "a"}, Owned: true},
		idShared:   {ID: idShared, State: "running", Zone: "us-east-1b", Tags: map[string]string{clusterTag: "shared"}, Owned: true, Lifecycle: "spot"},
		idForeign:  {ID: idForeign, State: "running", Zone: "us-east-1a", Tags: map[string]string{"kubernetes.io/cluster/other": "owned"}},
		idEmptyTag: {ID: idEmptyTag, State: "running", Zone: "us-east-1a", Tags: map[string]string{clusterTag: ""}},
		idOld:      {ID: idOld, State: "running", Zone: "us-east-1c", Tags: map[string]string{clusterTag: "owned"}, Owned: true},
		idDone:     {ID: idDone, State: "terminated", Zone: "us-east-1c", Tags: map[string]string{clusterTag: "owned"}, Owned: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Describe() =\n%+v\nwant\n%+v", got, want)
	}
	// One call rejected for naming the two unknown IDs, one without them; the malformed ID is
	// never sent (it would fail the whole call with InvalidInstanceID.Malformed).
	if n := f.emu.Calls(ec2emu.ActionDescribeInstances); n != 2 {
		t.Errorf("DescribeInstances calls = %d, want 2", n)
	}
}

func TestDescribeEmptyTagValueAcceptedOnlyWhenListed(t *testing.T) {
	f := newFixture(t, Config{ClusterTagValues: []string{"owned", ""}})
	got, err := f.client.Describe(context.Background(), []string{idEmptyTag, idShared})
	if err != nil {
		t.Fatal(err)
	}
	if !got[idEmptyTag].Owned || got[idShared].Owned {
		t.Errorf("with values [owned, \"\"]: empty-tag owned=%v, shared owned=%v; want true, false", got[idEmptyTag].Owned, got[idShared].Owned)
	}
}

// rewriteNotFound hides the IDs from EC2's NotFound messages, as a future wording might, to
// exercise the client's fallback of halving the ID list.
type rewriteNotFound struct{ next http.Handler }

var messageRE = regexp.MustCompile(`<Message>[^<]*</Message>`)

func (h rewriteNotFound) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := httptest.NewRecorder()
	h.next.ServeHTTP(rec, r)
	body := rec.Body.Bytes()
	if rec.Code == http.StatusBadRequest && bytes.Contains(body, []byte("InvalidInstanceID")) {
		body = messageRE.ReplaceAll(body, []byte("<Message>Some instance IDs do not exist</Message>"))
	}
	for k, v := range rec.Header() {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(body)
}

func TestDescribeIsolatesUnknownIDsWhenTheMessageNamesNone(t *testing.T) {
	f := newFixture(t, Config{})
	srv := httptest.NewServer(rewriteNotFound{f.emu})
	defer srv.Close()
	c, err := New(context.Background(), Config{Region: "us-east-1", Endpoint: srv.URL, ClusterTagKey: clusterTag})
	if err != nil {
		t.Fatal(err)
	}
	known := f.addOwned(t, 62)
	ids := append([]string{idUnknown}, known...)
	ids = append(ids, "i-0aaaaaaaaaaaaaaaa")
	got, err := c.Describe(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(known) {
		t.Errorf("Describe found %d instances, want %d", len(got), len(known))
	}
	for _, id := range known {
		if _, ok := got[id]; !ok {
			t.Errorf("%s missing", id)
		}
	}
	// Halving 64 IDs with one unknown in each half costs 1 + 2·(2·log2(32)+1) = 23 calls,
	// far fewer than one per ID.
	if n := f.emu.Calls(ec2emu.ActionDescribeInstances); n > 23 || n < 3 {
		t.Errorf("DescribeInstances calls = %d, want 3..23 (halving, not per ID)", n)
	}

	// The same fallback when terminating: the instance that vanished between the describe and
	// the terminate gets NotFound, the others are terminated once.
	f.emu.HideInstance(known[3], ec2emu.ActionTerminateInstances, true)
	out, err := c.Terminate(context.Background(), known[:8])
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range known[:8] {
		want := ResultTerminating
		if i == 3 {
			want = ResultNotFound
		}
		if out[id].Result != want || f.emu.Terminations(id) != map[bool]int{true: 0, false: 1}[i == 3] {
			t.Errorf("%s: %+v, %d terminations", id, out[id], f.emu.Terminations(id))
		}
	}
}

func TestTerminateBatches(t *testing.T) {
	f := newFixture(t, Config{})
	ids := f.addOwned(t, 1500)
	out, err := f.client.Terminate(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if o := out[id]; o.Result != ResultTerminating || o.PreviousState != "running" || o.CurrentState != "shutting-down" || o.Err != nil {
			t.Fatalf("%s: %+v", id, o)
		}
	}
	calls := f.emu.TerminateCalls()
	if len(calls) != 2 || len(calls[0]) != 1000 || len(calls[1]) != 500 {
		sizes := make([]int, len(calls))
		for i, c := range calls {
			sizes[i] = len(c)
		}
		t.Errorf("TerminateInstances batch sizes = %v, want [1000 500]", sizes)
	}
	for _, id := range ids {
		if n := f.emu.Terminations(id); n != 1 {
			t.Fatalf("%s terminated %d times, want exactly once", id, n)
		}
	}
	if got := f.metric(t, "nodevigil_ec2_request_duration_seconds", map[string]string{"operation": "TerminateInstances", "result": "success"}); got != 2 {
		t.Errorf("duration samples for TerminateInstances = %v, want 2", got)
	}

	// Terminating again is harmless: the describe shows them shutting down, nothing is sent.
	out, err = f.client.Terminate(context.Background(), ids[:10])
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[:10] {
		if out[id].Result != ResultAlreadyTerminated {
			t.Errorf("second terminate of %s: %+v", id, out[id])
		}
	}
	if n := len(f.emu.TerminateCalls()); n != 2 {
		t.Errorf("a second Terminate sent %d more calls", n-2)
	}
}

func TestTerminateOutcomes(t *testing.T) {
	f := newFixture(t, Config{})
	ids := []string{idOwned, idShared, idForeign, idEmptyTag, idOld, idDone, idUnknown, "i-XYZ"}
	out, err := f.client.Terminate(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		result Result
		err    error
	}{
		idOwned:    {ResultTerminating, nil},
		idShared:   {ResultTerminating, nil},
		idOld:      {ResultTerminating, nil},
		idForeign:  {ResultNotOwned, ErrNotOwned},
		idEmptyTag: {ResultNotOwned, ErrNotOwned},
		idDone:     {ResultAlreadyTerminated, nil},
		idUnknown:  {ResultNotFound, ErrNotFound},
		"i-XYZ":    {ResultFailed, ErrInvalidInstanceID},
	}
	if len(out) != len(want) {
		t.Errorf("got %d outcomes, want %d", len(out), len(want))
	}
	for id, w := range want {
		o := out[id]
		if o.Result != w.result || (w.err == nil) != (o.Err == nil) || (w.err != nil && !errors.Is(o.Err, w.err)) {
			t.Errorf("%s: got %+v, want %s wrapping %v", id, o, w.result, w.err)
		}
	}
	calls := f.emu.TerminateCalls()
	if len(calls) != 1 {
		t.Fatalf("TerminateInstances calls = %v, want one", calls)
	}
	sort.Strings(calls[0])
	if wantIDs := []string{idOwned, idShared, idOld}; !reflect.DeepEqual(calls[0], sortedCopy(wantIDs)) {
		t.Errorf("TerminateInstances was sent %v, want only the owned running instances %v", calls[0], wantIDs)
	}
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func TestNotOwnedRefusedWithoutTerminateCall(t *testing.T) {
	f := newFixture(t, Config{})
	out, err := f.client.Terminate(context.Background(), []string{idForeign, idEmptyTag})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{idForeign, idEmptyTag} {
		if out[id].Result != ResultNotOwned || !errors.Is(out[id].Err, ErrNotOwned) {
			t.Errorf("%s: %+v", id, out[id])
		}
	}
	if n := f.emu.Calls(ec2emu.ActionTerminateInstances); n != 0 {
		t.Errorf("TerminateInstances called %d times for instances the cluster does not own", n)
	}
	if in, _ := f.emu.Instance(idForeign); in.State != ec2emu.StateRunning {
		t.Errorf("foreign instance is %s", in.State)
	}
}

func TestThrottlingIsRetried(t *testing.T) {
	f := newFixture(t, Config{MaxAttempts: 5})
	f.emu.Throttle(ec2emu.ActionTerminateInstances, 3)
	f.emu.Throttle(ec2emu.ActionDescribeInstances, 1)
	out, err := f.client.Terminate(context.Background(), []string{idOwned})
	if err != nil {
		t.Fatal(err)
	}
	if out[idOwned].Result != ResultTerminating {
		t.Errorf("outcome %+v", out[idOwned])
	}
	if n := f.emu.Calls(ec2emu.ActionTerminateInstances); n != 4 {
		t.Errorf("TerminateInstances attempts = %d, want 4 (3 throttled + 1)", n)
	}
	if n := f.emu.Terminations(idOwned); n != 1 {
		t.Errorf("terminated %d times, want once", n)
	}
	for _, c := range []struct {
		op, code string
		want     float64
	}{
		{"TerminateInstances", codeThrottled, 3},
		{"TerminateInstances", "ok", 1},
		{"DescribeInstances", codeThrottled, 1},
		{"DescribeInstances", "ok", 1},
	} {
		if got := f.metric(t, "nodevigil_ec2_requests_total", map[string]string{"operation": c.op, "code": c.code}); got != c.want {
			t.Errorf("requests_total{%s,%s} = %v, want %v", c.op, c.code, got, c.want)
		}
	}
}

func TestThrottledForeverFailsAfterMaxAttempts(t *testing.T) {
	f := newFixture(t, Config{MaxAttempts: 3})
	f.emu.Throttle(ec2emu.ActionTerminateInstances, -1)
	out, err := f.client.Terminate(context.Background(), []string{idOwned, idShared})
	if err == nil {
		t.Fatal("Terminate succeeded while EC2 throttles every call")
	}
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != codeThrottled {
		t.Errorf("error %v does not carry the code %s", err, codeThrottled)
	}
	if errors.Is(err, ErrUnauthorized) {
		t.Errorf("throttling reported as unauthorized: %v", err)
	}
	for _, id := range []string{idOwned, idShared} {
		if out[id].Result != ResultFailed || out[id].Err == nil {
			t.Errorf("%s: %+v", id, out[id])
		}
	}
	if n := f.emu.Calls(ec2emu.ActionTerminateInstances); n != 3 {
		t.Errorf("TerminateInstances attempts = %d, want MaxAttempts=3", n)
	}
	if in, _ := f.emu.Instance(idOwned); in.State != ec2emu.StateRunning {
		t.Errorf("instance is %s", in.State)
	}
	if got := f.metric(t, "nodevigil_ec2_request_duration_seconds", map[string]string{"operation": "TerminateInstances", "result": "error"}); got != 1 {
		t.Errorf("error duration samples = %v, want 1 (one operation, retries included)", got)
	}
}

func TestUnauthorized(t *testing.T) {
	t.Run("terminate", func(t *testing.T) {
		f := newFixture(t, Config{})
		f.emu.SetUnauthorized(ec2emu.ActionTerminateInstances, true)
		ids := append(f.addOwned(t, 1001), idForeign)
		out, err := f.client.Terminate(context.Background(), ids)
		if !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("error %v, want ErrUnauthorized", err)
		}
		for _, id := range ids[:1001] {
			if out[id].Result != ResultUnauthorized || !errors.Is(out[id].Err, ErrUnauthorized) {
				t.Fatalf("%s: %+v", id, out[id])
			}
		}
		if out[idForeign].Result != ResultNotOwned {
			t.Errorf("foreign: %+v", out[idForeign])
		}
		// Not retried, and the second batch is not attempted: it would fail the same way.
		if n := f.emu.Calls(ec2emu.ActionTerminateInstances); n != 1 {
			t.Errorf("TerminateInstances attempts = %d, want 1", n)
		}
	})
	t.Run("describe", func(t *testing.T) {
		f := newFixture(t, Config{})
		f.emu.SetUnauthorized(ec2emu.ActionDescribeInstances, true)
		out, err := f.client.Terminate(context.Background(), []string{idOwned})
		if !errors.Is(err, ErrUnauthorized) || out[idOwned].Result != ResultUnauthorized {
			t.Fatalf("got %+v, %v", out[idOwned], err)
		}
		if n := f.emu.Calls(ec2emu.ActionTerminateInstances); n != 0 {
			t.Errorf("terminated without being able to check ownership (%d calls)", n)
		}
		if _, err := f.client.Describe(context.Background(), []string{idOwned}); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Describe error %v, want ErrUnauthorized", err)
		}
	})
}

func TestEventualConsistencyNotFound(t *testing.T) {
	f := newFixture(t, Config{})
	f.emu.SetNotFoundAfterTerminate(true)
	out, err := f.client.Terminate(context.Background(), []string{idOwned})
	if err != nil || out[idOwned].Result != ResultTerminating {
		t.Fatalf("first terminate: %+v, %v", out[idOwned], err)
	}
	// Right after terminating, EC2 claims not to know the instance.
	got, err := f.client.Describe(context.Background(), []string{idOwned, idShared})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[idOwned]; ok || len(got) != 1 {
		t.Errorf("Describe right after terminate = %v, want only %s", got, idShared)
	}
	// A retry of the termination reports NotFound and sends nothing.
	out, err = f.client.Terminate(context.Background(), []string{idOwned})
	if err != nil || out[idOwned].Result != ResultNotFound || !errors.Is(out[idOwned].Err, ErrNotFound) {
		t.Fatalf("second terminate: %+v, %v", out[idOwned], err)
	}
	if n := f.emu.Terminations(idOwned); n != 1 {
		t.Errorf("terminated %d times, want exactly once", n)
	}
	// Later EC2 shows the truth, which the caller confirms with Describe.
	f.emu.SetNotFoundAfterTerminate(false)
	f.clock.Step(time.Minute)
	got, err = f.client.Describe(context.Background(), []string{idOwned})
	if err != nil || got[idOwned].State != "terminated" {
		t.Errorf("Describe once consistent = %+v, %v; want terminated", got, err)
	}
}

func TestContextCancelled(t *testing.T) {
	f := newFixture(t, Config{})
	f.emu.SetLatency(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	out, err := f.client.Terminate(ctx, []string{idOwned})
	if !errors.Is(err, context.DeadlineExceeded) || out[idOwned].Result != ResultFailed {
		t.Errorf("got %+v, %v; want Failed with the context's error", out[idOwned], err)
	}
}

func TestMetricsShareARegistry(t *testing.T) {
	f := newFixture(t, Config{})
	// A second client on the same registry reuses the collectors instead of failing.
	c2, err := New(context.Background(), Config{Region: "us-east-1", Endpoint: f.srv.URL, ClusterTagKey: clusterTag, Registerer: f.reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.Describe(context.Background(), []string{idOwned}); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Describe(context.Background(), []string{idOwned}); err != nil {
		t.Fatal(err)
	}
	if got := f.metric(t, "nodevigil_ec2_requests_total", map[string]string{"operation": "DescribeInstances", "code": "ok"}); got != 2 {
		t.Errorf("requests_total = %v, want 2", got)
	}
}

// Regression test for the race bodyWithoutWriteTo works around: without it, about one call in
// ten with a 40 KB response failed on loopback with "use of closed network connection".
func TestNoTransportErrorsOnLargeResponses(t *testing.T) {
	f := newFixture(t, Config{MaxAttempts: 1})
	owned := f.addOwned(t, 50)
	for i := 0; i < 100; i++ {
		got, err := f.client.Describe(context.Background(), owned)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if len(got) != len(owned) {
			t.Fatalf("call %d: %d instances", i, len(got))
		}
	}
}

func TestCodeLabel(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{&smithy.GenericAPIError{Code: codeThrottled}, codeThrottled},
		{fmt.Errorf("wrapped: %w", &smithy.GenericAPIError{Code: codeUnauthorized}), codeUnauthorized},
		{&smithy.GenericAPIError{Code: "SomethingNew"}, "other"},
		{context.Canceled, "canceled"},
		{errors.New("connection refused"), "transport"},
	}
	for _, tt := range tests {
		if got := codeLabel(tt.err); got != tt.want {
			t.Errorf("codeLabel(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestNamedIDs(t *testing.T) {
	ids := []string{"i-01234567", "i-0123456789abcdef0", "i-0aaaaaaaaaaaaaaaa"}
	tests := []struct {
		msg  string
		want []string
	}{
		{"The instance ID 'i-0123456789abcdef0' does not exist", []string{"i-0123456789abcdef0"}},
		{"The instance IDs 'i-0123456789abcdef0, i-0aaaaaaaaaaaaaaaa' do not exist", []string{"i-0123456789abcdef0", "i-0aaaaaaaaaaaaaaaa"}},
		{`Invalid id: "i-01234567"`, []string{"i-01234567"}},
		{"Some instance IDs do not exist", []string{}},
	}
	for _, tt := range tests {
		got := sortedKeys(namedIDs(ids, &smithy.GenericAPIError{Code: codeNotFound, Message: tt.msg}))
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("namedIDs(%q) = %v, want %v", tt.msg, got, tt.want)
		}
	}
}
