package ec2

import (
	"context"
	"sync"
	"testing"
	"time"
)

// BenchmarkTerminate measures one decision's termination through the real SDK against the
// emulator on loopback: DescribeInstances (ownership) plus TerminateInstances for one ID.
func BenchmarkTerminate(b *testing.B) {
	f := newFixture(b, Config{})
	all := f.addOwned(b, b.N)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := f.client.Terminate(ctx, all[i:i+1])
		if err != nil || out[all[i]].Result != ResultTerminating {
			b.Fatalf("%+v, %v", out[all[i]], err)
		}
	}
}

// BenchmarkTerminate1000 measures a full batch: 1000 IDs in one Describe and one Terminate.
func BenchmarkTerminate1000(b *testing.B) {
	f := newFixture(b, Config{})
	all := f.addOwned(b, 1000*b.N)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch := all[i*1000 : (i+1)*1000]
		out, err := f.client.Terminate(ctx, batch)
		if err != nil || len(out) != 1000 {
			b.Fatalf("%d outcomes, %v", len(out), err)
		}
	}
}

// BenchmarkBatcher measures the latency a caller of Batcher.Terminate sees (the batching
// window included) when 100 decisions arrive at once, on the real clock. The budget is 1 s
// from decision to EC2 call; latency-ms reports the mean wait per caller.
func BenchmarkBatcher(b *testing.B) {
	f := newFixture(b, Config{})
	const callers = 100
	all := f.addOwned(b, callers*b.N)
	bt, err := NewBatcher(f.client, BatcherConfig{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var total time.Duration
	var mu sync.Mutex
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		for _, id := range all[i*callers : (i+1)*callers] {
			wg.Add(1)
			go func(id string) {
				defer wg.Done()
				start := time.Now()
				o, err := bt.Terminate(ctx, id)
				d := time.Since(start)
				if err != nil || o.Result != ResultTerminating {
					b.Errorf("%s: %+v, %v", id, o, err)
				}
				mu.Lock()
				total += d
				mu.Unlock()
			}(id)
		}
		wg.Wait()
	}
	b.StopTimer()
	b.ReportMetric(total.Seconds()*1000/float64(callers*b.N), "latency-ms")
	b.ReportMetric(float64(len(f.emu.TerminateCalls()))/float64(b.N), "calls/op")
}
