package remediation

import (
	"testing"
	"time"
)

// TestCurrentCensusReuse checks when a rail check reuses the cached census and when it counts the
// cluster again. A census taken just after the caller read the clock (another worker took it
// while this one waited for the lock) must be reused: recomputing it made 50 nodes failing at
// once wait for 50 passes over 10,000 nodes in a row.
func TestCurrentCensusReuse(t *testing.T) {
	tests := []struct {
		name   string
		offset time.Duration // of the caller's now from the cached census's time
		reuse  bool
	}{
		{"same instant", 0, true},
		{"census taken 50ms after the caller read the clock", -50 * time.Millisecond, true},
		{"census 900ms old", 900 * time.Millisecond, true},
		{"census older than the maximum age", DefaultCensusMaxAge, false},
		{"clock stepped back by more than the maximum age", -DefaultCensusMaxAge, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, ""))
			h.healthy(newNode("a"))
			c := h.c
			c.gateMu.Lock()
			defer c.gateMu.Unlock()
			first := c.currentCensus(t0)
			got := c.currentCensus(t0.Add(tt.offset))
			if reused := got == first; reused != tt.reuse {
				t.Fatalf("census reused = %v, want %v", reused, tt.reuse)
			}
		})
	}
}
