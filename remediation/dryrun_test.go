package remediation

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// TestDryRunRecordsWhatLiveWouldBlock: dry-run describes the instance, as the live pipeline
// does before marking, and records "would be Blocked: <reason>" where live mode would block —
// not owned, not allowed to describe, not found once confirmed — instead of "would terminate".
// A transient failure records nothing yet and is retried; without a Cloud nothing is
// described. TerminateInstances is never called.
func TestDryRunRecordsWhatLiveWouldBlock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(h *harness, id string)
		noEC2 bool
		// syncs: how many reconciles, with the clock moved past the NotFound confirmation
		// delay between them
		syncs      int
		wantRecord string // prefix of the dry-run annotation; "" for none
		wantEvent  string
		wantRetry  bool // a requeue and a cloud error counted
	}{
		{name: "owned", wantRecord: "Terminate NodeSilent ", wantEvent: EventWouldTerminate},
		{name: "not owned", setup: func(h *harness, id string) { h.cloud.owned[id] = false },
			wantRecord: "Blocked " + BlockNotOwned + " ", wantEvent: BlockNotOwned},
		{name: "describe unauthorized", setup: func(h *harness, id string) {
			h.cloud.describeErr[id] = []error{&CloudError{Kind: CloudErrorUnauthorized, Err: errors.New("UnauthorizedOperation")}}
		}, wantRecord: "Blocked " + BlockUnauthorized + " ", wantEvent: BlockUnauthorized},
		{name: "not found, confirmed", setup: func(h *harness, id string) { delete(h.cloud.instances, id) },
			syncs: 2, wantRecord: "Blocked " + BlockNotFound + " ", wantEvent: BlockNotFound},
		{name: "throttled", setup: func(h *harness, id string) {
			h.cloud.describeErr[id] = []error{&CloudError{Kind: CloudErrorThrottled, Err: errors.New("RequestLimitExceeded")}}
		}, wantRetry: true},
		{name: "no cloud (no --cluster-tag-key)", noEC2: true, wantRecord: "Terminate NodeSilent ", wantEvent: EventWouldTerminate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, "dryRun: true\n"))
			if tc.noEC2 {
				h.c.cloud = nil
			} else {
				h.c.cloud = DescribeOnly(h.cloud)
			}
			n := h.silent(newNode("dead"))
			if tc.setup != nil {
				tc.setup(h, instanceOf(n))
			}
			syncs := max(tc.syncs, 1)
			var requeue []int64
			for i := range syncs {
				if i > 0 {
					h.clock.Step(h.c.cfg.TerminationConfirmDelay)
				}
				r, err := h.sync("dead")
				if err != nil {
					t.Fatal(err)
				}
				requeue = append(requeue, int64(r))
			}
			got := h.node("dead")
			record := got.Annotations[decide.AnnotationDryRunDecision]
			switch {
			case tc.wantRecord == "" && record != "":
				t.Errorf("dry-run recorded %q, want nothing yet", record)
			case tc.wantRecord != "" && !strings.HasPrefix(record, tc.wantRecord):
				t.Errorf("dry-run recorded %q, want %q…", record, tc.wantRecord)
			}
			for _, k := range blockedAnnotations {
				if _, ok := got.Annotations[k]; ok {
					t.Errorf("dry-run wrote the live Blocked annotation %s", k)
				}
			}
			if got.Spec.Unschedulable || decide.PhaseOf(got) != decide.PhaseNone {
				t.Error("dry-run cordoned or marked the node")
			}
			if tc.wantEvent != "" && !hasEvent(h.events(), tc.wantEvent) {
				t.Errorf("no %s event; events %q", tc.wantEvent, h.events())
			}
			described := len(h.cloud.Describes()) > 0
			if described == tc.noEC2 {
				t.Errorf("described the instance: %v, want %v", described, !tc.noEC2)
			}
			if tc.wantRetry {
				if requeue[len(requeue)-1] <= 0 || testutil.ToFloat64(h.c.metrics.cloudErrors.WithLabelValues("Describe", CloudErrorThrottled)) != 1 {
					t.Errorf("a throttled Describe should be counted and retried: requeue %v", requeue)
				}
			}
			if len(h.cloud.Terminates()) != 0 {
				t.Errorf("dry-run called Terminate: %q", h.cloud.Terminates())
			}
			if strings.HasPrefix(tc.wantRecord, "Blocked") {
				if got := testutil.ToFloat64(h.c.metrics.blocked.WithLabelValues(tc.wantEvent)); got != 1 {
					t.Errorf("blocked_total{reason=%s} = %v, want 1", tc.wantEvent, got)
				}
				if n := testutil.ToFloat64(h.c.metrics.terminations.WithLabelValues(string(ResultDryRun))); n != 0 {
					t.Errorf("terminations_total{DryRun} = %v for a node dry-run would block", n)
				}
			}
			// Again: recorded once.
			before := slices.Clone(h.Steps())
			if _, err := h.sync("dead"); err != nil {
				t.Fatal(err)
			}
			if tc.wantRecord != "" && !slices.Equal(h.Steps(), before) {
				t.Errorf("dry-run wrote again: %q after %q", h.Steps(), before)
			}
		})
	}
}

// TestDescribeOnlyNeverTerminates: the Cloud dry-run runs with refuses Terminate without
// passing it on.
func TestDescribeOnlyNeverTerminates(t *testing.T) {
	f := newFakeCloud()
	c := DescribeOnly(f)
	out, err := c.Terminate(context.Background(), "i-0123456789abcdef0")
	if err == nil || out.Result != ResultFailed || len(f.Terminates()) != 0 {
		t.Errorf("Terminate through DescribeOnly: %+v, %v; reached the cloud %d times", out, err, len(f.Terminates()))
	}
	if DescribeOnly(nil) != nil {
		t.Error("DescribeOnly(nil) should stay nil")
	}
}
