package ec2

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// gatedDescriber records its calls; each call waits for a token on gate (when gate is set),
// so a test can hold the first call in flight while others queue.
type gatedDescriber struct {
	gate  chan struct{}
	err   error
	mu    sync.Mutex
	calls [][]string
}

func (g *gatedDescriber) Describe(ctx context.Context, ids []string) (map[string]Instance, error) {
	g.mu.Lock()
	g.calls = append(g.calls, sortedCopy(ids))
	g.mu.Unlock()
	if g.gate != nil {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if g.err != nil {
		return nil, g.err
	}
	out := map[string]Instance{}
	for _, id := range ids {
		if id != idForeign { // "unknown" to this fake
			out[id] = Instance{ID: id, State: "running", Owned: true}
		}
	}
	return out, nil
}

func (g *gatedDescriber) Calls() [][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([][]string(nil), g.calls...)
}

type dresult struct {
	id    string
	inst  Instance
	found bool
	err   error
}

func describeAll(ctx context.Context, b *DescribeBatcher, ids []string) <-chan dresult {
	out := make(chan dresult, len(ids))
	for _, id := range ids {
		go func(id string) {
			inst, found, err := b.Describe(ctx, id)
			out <- dresult{id, inst, found, err}
		}(id)
	}
	return out
}

func waitWaiting(t *testing.T, b *DescribeBatcher, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for b.waitingIDs() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d IDs wait for the next call, want %d", b.waitingIDs(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitCalls(t *testing.T, g *gatedDescriber, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(g.Calls()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d Describe calls, want %d", len(g.Calls()), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestNewDescribeBatcherValidates(t *testing.T) {
	if _, err := NewDescribeBatcher(nil); err == nil {
		t.Error("NewDescribeBatcher(nil) accepted")
	}
}

// A lone describe is sent at once, with no window: nothing waits when nothing else is in flight.
func TestDescribeBatcherSendsALoneCallAtOnce(t *testing.T) {
	g := &gatedDescriber{}
	b, err := NewDescribeBatcher(g)
	if err != nil {
		t.Fatal(err)
	}
	inst, found, err := b.Describe(context.Background(), idOwned)
	if err != nil || !found || inst.ID != idOwned {
		t.Fatalf("Describe = %+v, %v, %v", inst, found, err)
	}
	if got := g.Calls(); !reflect.DeepEqual(got, [][]string{{idOwned}}) {
		t.Errorf("calls = %v", got)
	}
}

// The describes asked for while one call is in flight go out together as soon as it returns:
// 1 + 50 describes (one of them twice) cost 2 calls.
func TestDescribeBatcherGroupsCallsBehindTheOneInFlight(t *testing.T) {
	g := &gatedDescriber{gate: make(chan struct{}, 2)}
	b, err := NewDescribeBatcher(g)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := describeAll(ctx, b, []string{idOwned})
	waitCalls(t, g, 1)
	rest := ids(50)
	results := describeAll(ctx, b, append(append([]string{}, rest...), rest[0], idForeign))
	waitWaiting(t, b, 51)
	g.gate <- struct{}{}
	g.gate <- struct{}{}
	if r := <-first; r.err != nil || !r.found {
		t.Errorf("first: %+v", r)
	}
	for range 52 {
		r := <-results
		if r.err != nil || r.found != (r.id != idForeign) || (r.found && r.inst.ID != r.id) {
			t.Errorf("%s: %+v", r.id, r)
		}
	}
	calls := g.Calls()
	if len(calls) != 2 || !reflect.DeepEqual(calls[1], sortedCopy(append(append([]string{}, rest...), idForeign))) {
		t.Errorf("calls = %v, want [%s] and one call with the 51 other distinct IDs", calls, idOwned)
	}
}

// An error of the call is every waiter's error; the next call starts afresh.
func TestDescribeBatcherReportsTheCallsError(t *testing.T) {
	g := &gatedDescriber{err: errors.New("boom")}
	b, err := NewDescribeBatcher(g)
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := b.Describe(context.Background(), idOwned); err == nil || found {
		t.Fatalf("found %v, err %v; want the call's error", found, err)
	}
	g.err = nil
	if _, found, err := b.Describe(context.Background(), idOwned); err != nil || !found {
		t.Errorf("after the error: found %v, err %v", found, err)
	}
}

// A caller that gives up before its ID is sent is withdrawn: nothing is sent for it.
func TestDescribeBatcherWithdrawsCancelledCallers(t *testing.T) {
	g := &gatedDescriber{gate: make(chan struct{}, 1)}
	b, err := NewDescribeBatcher(g)
	if err != nil {
		t.Fatal(err)
	}
	first := describeAll(context.Background(), b, []string{idOwned})
	waitCalls(t, g, 1)
	ctx, cancel := context.WithCancel(context.Background())
	gone := describeAll(ctx, b, []string{idShared})
	waitWaiting(t, b, 1)
	cancel()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Errorf("cancelled caller: %+v", r)
	}
	waitWaiting(t, b, 0)
	g.gate <- struct{}{}
	<-first
	if got := g.Calls(); len(got) != 1 {
		t.Errorf("calls = %v, want only the first", got)
	}
}

// Against the emulator through the real SDK: unknown IDs are not found, the others described,
// and the describes queued behind the first share one DescribeInstances.
func TestDescribeBatcherAgainstEmulator(t *testing.T) {
	f := newFixture(t, Config{})
	owned := f.addOwned(t, 20)
	b, err := NewDescribeBatcher(f.client)
	if err != nil {
		t.Fatal(err)
	}
	req := append(append([]string{}, owned...), idForeign, "i-0ffffffffffffffff")
	for r := range collect(describeAll(context.Background(), b, req), len(req)) {
		switch {
		case r.err != nil:
			t.Errorf("%s: %v", r.id, r.err)
		case r.id == "i-0ffffffffffffffff":
			if r.found {
				t.Errorf("unknown instance found: %+v", r.inst)
			}
		case !r.found || r.inst.Owned != (r.id != idForeign):
			t.Errorf("%s: found %v, %+v", r.id, r.found, r.inst)
		}
	}
	if n := f.emu.Calls(ec2emu.ActionDescribeInstances); n < 1 || n > len(req) {
		t.Errorf("DescribeInstances calls = %d", n)
	}
}

func collect(ch <-chan dresult, n int) <-chan dresult {
	out := make(chan dresult, n)
	for range n {
		out <- <-ch
	}
	close(out)
	return out
}
