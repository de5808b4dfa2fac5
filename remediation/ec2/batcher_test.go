package ec2

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// fakeTerminator records its calls and answers Terminating for every ID unless fn says
// otherwise.
type fakeTerminator struct {
	mu    sync.Mutex
	calls [][]string
	fn    func(ctx context.Context, ids []string) (map[string]Outcome, error)
}

func (f *fakeTerminator) Terminate(ctx context.Context, ids []string) (map[string]Outcome, error) {
	f.mu.Lock()
	f.calls = append(f.calls, sortedCopy(ids))
	f.mu.Unlock()
	if f.fn != nil {
		return f.fn(ctx, ids)
	}
	out := make(map[string]Outcome, len(ids))
	for _, id := range ids {
		out[id] = Outcome{Result: ResultTerminating, PreviousState: "running", CurrentState: "shutting-down"}
	}
	return out, nil
}

func (f *fakeTerminator) Calls() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]string(nil), f.calls...)
}

// waitPending waits until the open batch holds n distinct IDs, i.e. every caller has queued.
func waitPending(t *testing.T, b *Batcher, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.pendingIDs() != n {
		if time.Now().After(deadline) {
			t.Fatalf("open batch holds %d IDs, want %d", b.pendingIDs(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

type result struct {
	id  string
	o   Outcome
	err error
}

// terminateAll calls b.Terminate for each ID concurrently and returns a channel of results.
func terminateAll(ctx context.Context, b *Batcher, ids []string) <-chan result {
	out := make(chan result, len(ids))
	for _, id := range ids {
		go func(id string) {
			o, err := b.Terminate(ctx, id)
			out <- result{id, o, err}
		}(id)
	}
	return out
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("i-2%016x", i)
	}
	return out
}

func TestNewBatcherValidates(t *testing.T) {
	for _, cfg := range []BatcherConfig{{Window: -1}, {MaxBatch: MaxBatch + 1}, {MaxBatch: -1}} {
		if _, err := NewBatcher(&fakeTerminator{}, cfg); err == nil {
			t.Errorf("NewBatcher(%+v) accepted", cfg)
		}
	}
	if _, err := NewBatcher(nil, BatcherConfig{}); err == nil {
		t.Error("NewBatcher(nil) accepted")
	}
}

func TestBatcherCoalescesConcurrentCalls(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ft := &fakeTerminator{}
	b, err := NewBatcher(ft, BatcherConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	all := ids(50)
	results := terminateAll(context.Background(), b, all)
	waitPending(t, b, len(all))
	if n := len(ft.Calls()); n != 0 {
		t.Fatalf("sent %d calls before the window passed", n)
	}
	clk.Step(DefaultBatchWindow)
	for range all {
		r := <-results
		if r.err != nil || r.o.Result != ResultTerminating {
			t.Errorf("%s: %+v, %v", r.id, r.o, r.err)
		}
	}
	if got := ft.Calls(); len(got) != 1 || !reflect.DeepEqual(got[0], sortedCopy(all)) {
		t.Errorf("calls = %v, want one call with all 50 IDs", got)
	}
}

// TestBatcherGroupCommitAddsNoWait: with GroupCommit a lone termination is sent at once (the
// fake clock never moves: a window would hold it for ever), and the terminations asked for
// while a call is in flight are sent together as soon as it returns. Fails if GroupCommit is
// ignored (the lone call waits for the 50 ms window).
func TestBatcherGroupCommitAddsNoWait(t *testing.T) {
	release := make(chan struct{})
	first := true
	var mu sync.Mutex
	ft := &fakeTerminator{}
	ft.fn = func(ctx context.Context, ids []string) (map[string]Outcome, error) {
		mu.Lock()
		block := first
		first = false
		mu.Unlock()
		if block {
			<-release
		}
		out := map[string]Outcome{}
		for _, id := range ids {
			out[id] = Outcome{Result: ResultTerminating}
		}
		return out, nil
	}
	b, err := NewBatcher(ft, BatcherConfig{GroupCommit: true, Clock: clocktesting.NewFakeClock(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all := ids(11)
	lone := terminateAll(ctx, b, all[:1])
	deadline := time.Now().Add(20 * time.Second)
	for len(ft.Calls()) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("a lone termination was not sent without the clock moving")
		}
		time.Sleep(time.Millisecond)
	}
	rest := terminateAll(ctx, b, all[1:])
	waitPending(t, b, len(all)-1)
	close(release)
	for range 1 {
		if r := <-lone; r.err != nil || r.o.Result != ResultTerminating {
			t.Errorf("%s: %+v, %v", r.id, r.o, r.err)
		}
	}
	for range all[1:] {
		if r := <-rest; r.err != nil || r.o.Result != ResultTerminating {
			t.Errorf("%s: %+v, %v", r.id, r.o, r.err)
		}
	}
	if got := ft.Calls(); len(got) != 2 || !reflect.DeepEqual(got[1], sortedCopy(all[1:])) {
		t.Errorf("calls = %v, want the lone ID, then the 10 asked for during it in one call", got)
	}
}

func TestBatcherSharesOneRequestPerID(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ft := &fakeTerminator{}
	b, _ := NewBatcher(ft, BatcherConfig{Clock: clk})
	same := []string{"i-0123456789abcdef0", "i-0123456789abcdef0", "i-0123456789abcdef0"}
	results := terminateAll(context.Background(), b, same)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		n := len(b.pending[same[0]])
		b.mu.Unlock()
		if n == len(same) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d callers queued", n, len(same))
		}
		time.Sleep(time.Millisecond)
	}
	clk.Step(DefaultBatchWindow)
	for range same {
		if r := <-results; r.o.Result != ResultTerminating {
			t.Errorf("%+v", r)
		}
	}
	if got := ft.Calls(); !reflect.DeepEqual(got, [][]string{{same[0]}}) {
		t.Errorf("calls = %v, want the ID once", got)
	}
}

func TestBatcherSendsFullBatchAtOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ft := &fakeTerminator{}
	b, _ := NewBatcher(ft, BatcherConfig{Clock: clk, MaxBatch: 3})
	all := ids(7)
	results := terminateAll(context.Background(), b, all)
	// Six callers are answered without the clock moving: two full batches.
	for i := 0; i < 6; i++ {
		if r := <-results; r.err != nil {
			t.Fatal(r.err)
		}
	}
	waitPending(t, b, 1)
	clk.Step(DefaultBatchWindow)
	if r := <-results; r.err != nil {
		t.Fatal(r.err)
	}
	sizes := []int{}
	for _, c := range ft.Calls() {
		sizes = append(sizes, len(c))
	}
	if !reflect.DeepEqual(sizes, []int{3, 3, 1}) {
		t.Errorf("batch sizes = %v, want [3 3 1]", sizes)
	}
}

func TestBatcherWithdrawsCancelledCallers(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ft := &fakeTerminator{}
	b, _ := NewBatcher(ft, BatcherConfig{Clock: clk})
	all := ids(3)
	ctx, cancel := context.WithCancel(context.Background())
	results := terminateAll(ctx, b, all[:2])
	waitPending(t, b, 2)
	cancel()
	for i := 0; i < 2; i++ {
		if r := <-results; !errors.Is(r.err, context.Canceled) {
			t.Errorf("%s: %v, want context.Canceled", r.id, r.err)
		}
	}
	if n := b.pendingIDs(); n != 0 || clk.HasWaiters() {
		t.Errorf("after withdrawal: %d pending IDs, timer armed %v", n, clk.HasWaiters())
	}
	// A later caller opens a new batch that carries only its own ID.
	results = terminateAll(context.Background(), b, all[2:])
	waitPending(t, b, 1)
	clk.Step(DefaultBatchWindow)
	<-results
	if got := ft.Calls(); !reflect.DeepEqual(got, [][]string{{all[2]}}) {
		t.Errorf("calls = %v, want only %s", got, all[2])
	}
}

func TestBatcherCancelsCallWhenEveryCallerGaveUp(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	sawCancel := make(chan error, 1)
	ft := &fakeTerminator{fn: func(ctx context.Context, ids []string) (map[string]Outcome, error) {
		<-ctx.Done()
		sawCancel <- ctx.Err()
		return nil, ctx.Err()
	}}
	b, _ := NewBatcher(ft, BatcherConfig{Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	results := terminateAll(ctx, b, ids(2))
	waitPending(t, b, 2)
	clk.Step(DefaultBatchWindow)
	for len(ft.Calls()) == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-sawCancel; !errors.Is(err, context.Canceled) {
		t.Errorf("the in-flight call saw %v, want context.Canceled", err)
	}
	for i := 0; i < 2; i++ {
		if r := <-results; !errors.Is(r.err, context.Canceled) {
			t.Errorf("%v", r.err)
		}
	}
}

func TestBatcherReportsPerIDErrors(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	all := ids(3)
	callErr := errors.New("boom")
	ft := &fakeTerminator{fn: func(ctx context.Context, ids []string) (map[string]Outcome, error) {
		return map[string]Outcome{
			all[0]: {Result: ResultUnauthorized, Err: fmt.Errorf("x: %w", ErrUnauthorized)},
			all[1]: {Result: ResultAlreadyTerminated, PreviousState: "terminated", CurrentState: "terminated"},
			// all[2] missing: the call's error is reported.
		}, callErr
	}}
	b, _ := NewBatcher(ft, BatcherConfig{Clock: clk})
	results := terminateAll(context.Background(), b, all)
	waitPending(t, b, 3)
	clk.Step(DefaultBatchWindow)
	got := map[string]result{}
	for range all {
		r := <-results
		got[r.id] = r
	}
	if r := got[all[0]]; r.o.Result != ResultUnauthorized || !errors.Is(r.err, ErrUnauthorized) {
		t.Errorf("unauthorized: %+v", r)
	}
	if r := got[all[1]]; r.o.Result != ResultAlreadyTerminated || r.err != nil {
		t.Errorf("already terminated: %+v", r)
	}
	if r := got[all[2]]; r.o.Result != ResultFailed || !errors.Is(r.err, callErr) {
		t.Errorf("missing outcome: %+v", r)
	}
}

// End to end: concurrent single-ID terminations through the real client and SDK become one
// DescribeInstances and one TerminateInstances call.
func TestBatcherAgainstEmulator(t *testing.T) {
	f := newFixture(t, Config{})
	owned := f.addOwned(t, 20)
	clk := clocktesting.NewFakeClock(time.Now())
	b, err := NewBatcher(f.client, BatcherConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	req := append(append([]string{}, owned...), idForeign)
	results := terminateAll(context.Background(), b, req)
	waitPending(t, b, len(req))
	clk.Step(DefaultBatchWindow)
	for range req {
		r := <-results
		want := ResultTerminating
		if r.id == idForeign {
			want = ResultNotOwned
		}
		if r.o.Result != want {
			t.Errorf("%s: %+v, %v", r.id, r.o, r.err)
		}
	}
	calls := f.emu.TerminateCalls()
	if len(calls) != 1 {
		t.Fatalf("TerminateInstances calls = %d, want 1", len(calls))
	}
	sort.Strings(calls[0])
	if !reflect.DeepEqual(calls[0], sortedCopy(owned)) {
		t.Errorf("terminated %v, want the 20 owned instances", calls[0])
	}
	if n := f.emu.Calls(ec2emu.ActionDescribeInstances); n != 1 {
		t.Errorf("DescribeInstances calls = %d, want 1", n)
	}
}
