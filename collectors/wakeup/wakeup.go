// Package wakeup puts a process's periodic jobs on one schedule, so they wake the process
// together instead of each at its own moment.
//
// Why: an idle agent's CPU is mostly the cost of waking up, not of the work done. Every
// distinct timer expiry wakes a thread from its sleep, and the Go runtime's sysmon thread,
// which sleeps until the next timer, runs its own loop once per wake-up too. The agent has
// several periodic jobs (the AWS event watcher's spot poll every 2 s, the check cycle and the
// heartbeat Lease renewal every 10 s, the scheduled-events poll every minute); started
// independently, each ticks at its own offset and the process wakes once per job per period.
// On a Grid every job's deadlines are Origin + k·interval, so with intervals that divide one
// another (2 s, 10 s, 1 m) the 10 s jobs fall on a spot poll's wake-up and cost no wake-up of
// their own.
//
// The Origin is per process and random within the longest aligned period
// (NewGrid), so the agents of a cluster still spread their Lease renewals and API calls over
// time as the jitter they replace did.
package wakeup

import (
	"math/rand/v2"
	"time"
)

// Grid is a schedule shared by a process's periodic jobs. The zero Grid is off: Next is then
// now + interval, each job on its own schedule as before.
type Grid struct {
	// Origin is the instant every aligned job's deadlines count from.
	Origin time.Time
}

// NewGrid returns a Grid whose Origin is now minus a random fraction of spread (the longest
// interval aligned on it), so processes started together do not wake together.
func NewGrid(now time.Time, spread time.Duration) Grid {
	if spread <= 0 {
		return Grid{Origin: now}
	}
	return Grid{Origin: now.Add(-rand.N(spread))}
}

// On reports whether the Grid is in use (a non-zero Origin).
func (g Grid) On() bool { return !g.Origin.IsZero() }

// Next is the first deadline of a job run every interval that lies after now: the smallest
// Origin + k·interval later than now (never more than one interval ahead), or now + interval
// when the Grid is off or interval is not positive.
func (g Grid) Next(now time.Time, interval time.Duration) time.Time {
	if !g.On() || interval <= 0 {
		return now.Add(interval)
	}
	since := now.Sub(g.Origin)
	k := since / interval
	if since < 0 && since%interval != 0 {
		k-- // floor for instants before the Origin
	}
	return g.Origin.Add((k + 1) * interval)
}
