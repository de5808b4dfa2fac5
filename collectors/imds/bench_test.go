package imds

import (
	"context"
	"testing"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// BenchmarkPollSpotGroup is the watcher's steady-state cost on EC2: one poll of the spot
// group (the spot and rebalance paths, both 404 while nothing is pending), every 2 s by
// default. Run with -benchmem: its allocations are most of the agent's idle garbage.
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
	for b.Loop() {
		w.pollGroup(ctx, g)
	}
	if r := w.latest[collectors.CheckSpotInterruption]; r.Reason != ReasonNoEvent {
		b.Fatalf("spot: %s %s", r.Reason, r.Message)
	}
}
