package wakeup

import (
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	origin := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	g := Grid{Origin: origin}
	tests := []struct {
		name     string
		grid     Grid
		now      time.Duration // after origin
		interval time.Duration
		want     time.Duration // after origin
	}{
		{"off: now plus interval", Grid{}, 1300 * time.Millisecond, 2 * time.Second, 3300 * time.Millisecond},
		{"at the origin: one interval on", g, 0, 2 * time.Second, 2 * time.Second},
		{"between two points: the next", g, 1300 * time.Millisecond, 2 * time.Second, 2 * time.Second},
		{"on a point: the one after", g, 10 * time.Second, 2 * time.Second, 12 * time.Second},
		{"a 10 s job lands on a 2 s point", g, 3 * time.Second, 10 * time.Second, 10 * time.Second},
		{"late by more than an interval: no catching up", g, 25 * time.Second, 2 * time.Second, 26 * time.Second},
		{"before the origin", g, -1500 * time.Millisecond, 2 * time.Second, 0},
		{"before the origin, on a point", g, -2 * time.Second, 2 * time.Second, 0},
		{"no interval", g, time.Second, 0, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.grid.Next(origin.Add(tc.now), tc.interval)
			if want := origin.Add(tc.want); !got.Equal(want) {
				t.Errorf("Next(origin%+v, %v) = origin%+v, want origin%+v", tc.now, tc.interval, got.Sub(origin), tc.want)
			}
		})
	}
}

// TestNewGridSpreads: two processes started at the same instant get different Origins within
// the spread, so their jobs do not wake together.
func TestNewGridSpreads(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	seen := map[time.Time]bool{}
	for range 20 {
		g := NewGrid(now, 10*time.Second)
		if d := now.Sub(g.Origin); d < 0 || d >= 10*time.Second {
			t.Fatalf("origin %v before now, want within [0, 10s)", d)
		}
		seen[g.Origin] = true
	}
	if len(seen) < 2 {
		t.Error("20 grids share one origin; want them spread")
	}
	if g := NewGrid(now, 0); !g.Origin.Equal(now) || !g.On() {
		t.Errorf("no spread: %+v, want origin now", g)
	}
}
