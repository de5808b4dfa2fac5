package ec2emu

import (
	"strings"
	"testing"
	"time"
)

// TestReclaim: AWS taking an instance back shuts it down and terminates it as TerminateInstances
// would, but counts no termination nodevigil asked for; an unknown instance is an error and a
// second reclaim changes nothing.
func TestReclaim(t *testing.T) {
	s, clk := newTestServer(t, Config{ShutdownDelay: 5 * time.Second})
	if err := s.Reclaim(idA); err != nil {
		t.Fatal(err)
	}
	state := func() string { in, _ := s.Instance(idA); return in.State }
	if got := state(); got != StateShuttingDown {
		t.Fatalf("state right after reclaim %q, want %q", got, StateShuttingDown)
	}
	clk.Step(3 * time.Second)
	if err := s.Reclaim(idA); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	if got := state(); got != StateTerminated {
		t.Fatalf("state 5 s after the first reclaim %q, want %q (a second reclaim must not restart the shutdown)", got, StateTerminated)
	}
	if n, calls := s.Terminations(idA), len(s.TerminateCalls()); n != 0 || calls != 0 {
		t.Errorf("%d terminations and %d TerminateInstances calls counted for AWS's own reclaim, want 0", n, calls)
	}
	if err := s.Reclaim("i-0000000000000dead"); err == nil || !strings.Contains(err.Error(), "no such instance") {
		t.Errorf("reclaim of an unknown instance: %v", err)
	}
}
