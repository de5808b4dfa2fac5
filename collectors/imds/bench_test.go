package imds

import (
	"context"
	"syscall"
	"testing"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// BenchmarkPollSpotGroup is the watcher's steady-state cost on EC2: one poll of the spot
// group (the spot and rebalance paths, both 404 while nothing is pending), every 2 s by
// default. Run with -benchmem: its allocations are most of the agent's idle garbage. It
// reports cpu-ns/op, the process's user+system CPU per poll (getrusage), which a loaded
// machine inflates far less than ns/op; both include the emulated service, served in-process.
func BenchmarkPollSpotGroup(b *testing.B) {
	_, url, _ := emulated(b, ec2emu.LifecycleSpot)
	w, err := New(Config{Endpoint: url})
	if err != nil {
		b.Fatal(err)
	}
	g := &group{kinds: []collectors.CheckName{collectors.CheckSpotInterruption, collectors.CheckRebalanceRecommendation}, interval: DefaultSpotInterval, spot: true}
	ctx := context.Background()
	w.pollGroup(ctx, g) // token
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for b.Loop() {
		w.pollGroup(ctx, g)
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
	if r := w.latest[collectors.CheckSpotInterruption]; r.Reason != ReasonNoEvent {
		b.Fatalf("spot: %s %s", r.Reason, r.Message)
	}
}

// cpuTime is the process's user+system CPU so far, in nanoseconds.
func cpuTime(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
