// Command interruptlatency measures AWS interruption handling end to end on a real control
// plane (issue 14 item 8), with the real binaries: nodevigil-agent processes each reading its
// own instance's metadata service from the EC2 emulator (IMDSv2), and one nodevigil-remediator.
//
// Latency: spot notice visible in IMDS → Node cordoned. For each -intervals value (the agents'
// imds.spotInterval; "default" leaves the agent's own default), -nodes spot nodes run a real
// agent each, all under one remediator (one pool per interval, spot → Drain, maxImmediate
// 100% so notices that overlap by chance are not capped), measured in the same window so load
// affects every interval alike. Each node takes -notices notices in turn: after a random pause
// (0 to -jitter, so a notice lands at a random phase of the agent's poll), a notice is
// published; when the node is cordoned the notice is withdrawn, and the next one waits for the
// remediator to release the node. Every latency is split in three, one clock (this process's):
//
//   - poll wait: notice published → the agent's first read of spot/instance-action answered
//     200 (the emulator's metadata handler, wrapped here);
//   - agent → API: that read → the Node update carrying NoSpotInterruption=False arriving on a
//     watch of the Nodes (the agent's evaluation, its status patch and the watch delivery);
//   - remediator: that update → the Node update carrying the cordon and taint on the same watch
//     (the remediator's informer, its EC2 cross-check, cached after the first notice of an
//     instance, and its patch).
//
// EC2 API calls: -ec2-instances bare Nodes (providerID only, no agent, no Lease; the poll
// reads nothing else) and as many emulated instances, under the same remediator, in a pool
// whose remediation is off and whose interruptions are all Ignore. The emulator counts the
// DescribeInstanceStatus and DescribeInstances calls it receives in each minute of -ec2-window,
// starting at the first DescribeInstanceStatus call, at the remediator's default
// --scheduled-events-interval (1m) unless -events-interval says otherwise.
//
//	go run ./integration/bench/interruptlatency -intervals 2s,default -nodes 5 -notices 6
//	go run ./integration/bench/interruptlatency -nodes 0 -ec2-instances 10000 -ec2-window 3m
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/awsevents"
	"github.com/nodevigil/nodevigil/integration/bench/benchmain"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

type options struct {
	intervals      []string
	nodes, notices int
	jitter         time.Duration
	timeout        time.Duration
	ec2Instances   int
	ec2Window      time.Duration
	eventsInterval time.Duration
	creators       int
}

func main() {
	var o options
	var intervals string
	flag.StringVar(&intervals, "intervals", "2s,default", "comma-separated agent imds.spotInterval values to compare in one window; \"default\" is the agent's own default")
	flag.IntVar(&o.nodes, "nodes", 5, "spot nodes with a real agent, per interval (0: skip the latency measurement)")
	flag.IntVar(&o.notices, "notices", 6, "spot notices per node, one after the other")
	flag.DurationVar(&o.jitter, "jitter", 5*time.Second, "random pause before each notice (0 to this), so notices land at every phase of the agent's poll")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up on one notice (not cordoned, or not released) after this")
	flag.IntVar(&o.ec2Instances, "ec2-instances", 0, "instances (bare Nodes) behind the remediator's DescribeInstanceStatus poll (0: skip the EC2 call count)")
	flag.DurationVar(&o.ec2Window, "ec2-window", 3*time.Minute, "how long EC2 calls are counted, after the first poll")
	flag.DurationVar(&o.eventsInterval, "events-interval", 0, "remediator --scheduled-events-interval (0: its default, 1m)")
	flag.IntVar(&o.creators, "creators", 16, "concurrent Node creators for -ec2-instances")
	flag.Parse()
	for _, s := range strings.Split(intervals, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.intervals = append(o.intervals, s)
		}
	}
	benchmain.Main("interruptlatency", o.validate, func(ctx context.Context) error { return run(ctx, o) })
}

func (o options) validate() error {
	if o.nodes < 0 || o.notices < 1 || o.ec2Instances < 0 {
		return errors.New("-nodes and -ec2-instances must be 0 or more, -notices 1 or more")
	}
	if o.nodes == 0 && o.ec2Instances == 0 {
		return errors.New("nothing to measure: -nodes and -ec2-instances are both 0")
	}
	for _, s := range o.intervals {
		if s == "default" {
			continue
		}
		if d, err := time.ParseDuration(s); err != nil || d <= 0 {
			return fmt.Errorf("-intervals: %q is neither a positive duration nor \"default\"", s)
		}
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "interruptlatency: %s %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// sample is one notice's timeline.
type sample struct {
	interval                      string
	at, read, spotFalse, cordoned time.Time
}

func run(ctx context.Context, o options) error {
	setup, err := benchmain.Start(ctx, "interruptlatency", logf,
		"github.com/nodevigil/nodevigil/agent/cmd/nodevigil-agent", "github.com/nodevigil/nodevigil/remediation/cmd/nodevigil-remediator")
	if err != nil {
		return err
	}
	defer setup.Close()
	dir, cp, agentBin, remBin := setup.Dir, setup.CP, setup.Bins[0], setup.Bins[1]
	rc := cp.Config()
	rc.QPS, rc.Burst = 1000, 2000
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	const ns = "interruptlatency"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	cl := &awsevents.Cluster{Client: client, Kubeconfig: cp.KubeconfigPath(), AgentBin: agentBin, RemediatorBin: remBin}
	w, err := awsevents.NewWorld(cl, ns, dir)
	if err != nil {
		return err
	}
	defer w.Close()
	w.AgentLease = 10 * time.Second
	w.RemediatorLogLevel = "info"

	fmt.Printf("# interruptlatency %s\n\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("Flags: %s\n\n", strings.Join(os.Args[1:], " "))
	fmt.Printf("Load average at start: %s\n\n", benchmain.LoadAvg())

	var policies string
	byInterval := map[string][]*awsevents.Node{}
	for _, iv := range o.intervals {
		if o.nodes == 0 {
			break
		}
		pool := "spot-" + iv
		policies += w.PolicyFor(pool, "interruptions: {maxImmediate: 100%}")
		opts := awsevents.AgentOptions{}
		if iv != "default" {
			opts.SpotInterval, _ = time.ParseDuration(iv)
		}
		for range o.nodes {
			n, err := w.AddNode(ctx, pool, ec2emu.LifecycleSpot, opts)
			if err != nil {
				return err
			}
			byInterval[iv] = append(byInterval[iv], n)
		}
	}
	if o.ec2Instances > 0 {
		policies += w.PolicyFor("bulk", "interruptions: {spotInterruption: Ignore, rebalanceRecommendation: Ignore, scheduledReboot: Ignore, scheduledRetirement: Ignore, asgTermination: Ignore}")
		logf("creating %d bare Nodes and instances", o.ec2Instances)
		start := time.Now()
		if _, err := w.AddBulkNodes(ctx, "bulk", o.ec2Instances, o.creators, func(d int) { logf("%d Nodes created", d) }); err != nil {
			return err
		}
		logf("created in %s", time.Since(start).Round(time.Second))
	}
	var extra []string
	if o.eventsInterval > 0 {
		extra = append(extra, "--scheduled-events-interval", o.eventsInterval.String())
	}
	logf("starting the remediator")
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	err = w.StartRemediator(sctx, policies, extra...)
	cancel()
	if err != nil {
		return err
	}
	remStarted := time.Now()

	var ec2Done chan ec2Result
	if o.ec2Instances > 0 {
		ec2Done = make(chan ec2Result, 1)
		go func() { ec2Done <- countEC2(ctx, w, o, remStarted) }()
	}
	if o.nodes > 0 {
		samples, failures := measureLatency(ctx, w, o, byInterval)
		printLatency(o, samples, failures)
	}
	if ec2Done != nil {
		r := <-ec2Done
		printEC2(o, r)
	}
	fmt.Printf("Load average at end: %s\n", benchmain.LoadAvg())
	if exited, err := w.Remediator().Exited(); exited {
		return fmt.Errorf("the remediator exited during the run: %v\n%s", err, w.Remediator().LogTail(30))
	}
	return ctx.Err()
}

func measureLatency(ctx context.Context, w *awsevents.World, o options, byInterval map[string][]*awsevents.Node) ([]sample, []string) {
	tr := w.Track(ctx)
	var (
		mu       sync.Mutex
		samples  []sample
		failures []string
		wg       sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	logf("measuring: %d intervals × %d nodes × %d notices", len(byInterval), o.nodes, o.notices)
	for iv, nodes := range byInterval {
		for _, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The agent's first report, before any notice.
				wctx, cancel := context.WithTimeout(ctx, o.timeout)
				_, ok := tr.Wait(wctx, n.Name, func(awsevents.Seen) bool { return spotTrue(ctx, w, n) })
				cancel()
				if !ok {
					fail("%s: the agent never reported NoSpotInterruption=True", n.Name)
					return
				}
				for i := range o.notices {
					if err := sleep(ctx, rand.N(o.jitter+1)); err != nil {
						return
					}
					if err := n.AgentAlive(); err != nil {
						fail("%v", err)
						return
					}
					tr.Reset(n.Name)
					at := n.SpotNotice()
					wctx, cancel := context.WithTimeout(ctx, o.timeout)
					s, ok := tr.Wait(wctx, n.Name, func(s awsevents.Seen) bool { return !s.Cordoned.IsZero() })
					cancel()
					if !ok {
						fail("%s notice %d: not cordoned within %s", n.Name, i, o.timeout)
						return
					}
					mu.Lock()
					samples = append(samples, sample{interval: iv, at: at, read: n.SpotRead(), spotFalse: s.SpotFalse, cordoned: s.Cordoned})
					mu.Unlock()
					n.WithdrawSpotNotice()
					wctx, cancel = context.WithTimeout(ctx, o.timeout)
					_, ok = tr.Wait(wctx, n.Name, func(s awsevents.Seen) bool { return !s.Released.IsZero() })
					cancel()
					if !ok {
						fail("%s notice %d: not released within %s of the withdrawal", n.Name, i, o.timeout)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	return samples, failures
}

// spotTrue reads the node's NoSpotInterruption (the Tracker only keeps notice times).
func spotTrue(ctx context.Context, w *awsevents.World, n *awsevents.Node) bool {
	obj, err := w.Get(ctx, n)
	if err != nil {
		return false
	}
	c := awsevents.Condition(obj, awsevents.SpotCondition)
	return c != nil && c.Status == corev1.ConditionTrue
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// pct is the nearest-rank percentile of sorted ds.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*p/100+0.999999) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

func printLatency(o options, samples []sample, failures []string) {
	fmt.Printf("## Spot notice in IMDS → Node cordoned\n\n")
	fmt.Printf("%d nodes per interval, %d notices each, one remediator; nearest-rank percentiles (with n < 100, p99 is the maximum).\n\n", o.nodes, o.notices)
	fmt.Println("| agent spotInterval | part | n | p50 | p90 | p99 | max |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|")
	for _, iv := range o.intervals {
		parts := []struct {
			name string
			f    func(s sample) time.Duration
		}{
			{"**notice → cordon**", func(s sample) time.Duration { return s.cordoned.Sub(s.at) }},
			{"poll wait (notice → agent's read)", func(s sample) time.Duration { return s.read.Sub(s.at) }},
			{"agent → API (read → condition False on the watch)", func(s sample) time.Duration { return s.spotFalse.Sub(s.read) }},
			{"remediator (condition → cordon on the watch)", func(s sample) time.Duration { return s.cordoned.Sub(s.spotFalse) }},
		}
		for _, p := range parts {
			var ds []time.Duration
			for _, s := range samples {
				if s.interval == iv && !s.read.IsZero() && !s.spotFalse.IsZero() {
					ds = append(ds, p.f(s))
				}
			}
			slices.Sort(ds)
			fmt.Printf("| %s | %s | %d | %s | %s | %s | %s |\n", iv, p.name, len(ds), ms(pct(ds, 50)), ms(pct(ds, 90)), ms(pct(ds, 99)), ms(pct(ds, 100)))
		}
	}
	fmt.Println()
	if len(failures) > 0 {
		fmt.Printf("Failures (%d):\n\n", len(failures))
		for _, f := range failures {
			fmt.Printf("- %s\n", f)
		}
		fmt.Println()
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// ec2Result is the emulator's count of the remediator's EC2 calls, per minute of the window.
type ec2Result struct {
	firstPoll  time.Duration // remediator ready → the first DescribeInstanceStatus
	status     []int         // DescribeInstanceStatus calls per minute
	describe   []int         // DescribeInstances calls per minute
	totalState int
	totalDesc  int
	polls      float64 // the remediator's completed polls in the window (its own counter)
	err        error
}

// countEC2 waits for the first DescribeInstanceStatus call, then counts calls per minute for
// -ec2-window, from a one-second sampling of the emulator's counters.
func countEC2(ctx context.Context, w *awsevents.World, o options, since time.Time) ec2Result {
	var r ec2Result
	emu := w.EC2
	const pollsOK = `nodevigil_remediator_scheduled_event_polls_total{result="ok"}`
	for emu.Calls(ec2emu.ActionDescribeInstanceStatus) == 0 {
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			r.err = err
			return r
		}
		if time.Since(since) > 5*time.Minute {
			r.err = errors.New("no DescribeInstanceStatus call within 5 minutes of the remediator's start")
			return r
		}
	}
	r.firstPoll = time.Since(since)
	// The window starts at the first call, and counts it: s0 is 0, and so is the poll count
	// (the first poll is still running).
	start := time.Now()
	s0, d0 := 0, emu.Calls(ec2emu.ActionDescribeInstances)
	logf("first DescribeInstanceStatus %s after the remediator was ready; counting EC2 calls for %s", r.firstPoll.Round(time.Millisecond), o.ec2Window)
	for m := time.Duration(0); m < o.ec2Window; m += time.Minute {
		if err := sleep(ctx, time.Until(start.Add(m+time.Minute))); err != nil {
			r.err = err
			return r
		}
		s1, d1 := emu.Calls(ec2emu.ActionDescribeInstanceStatus), emu.Calls(ec2emu.ActionDescribeInstances)
		r.status = append(r.status, s1-s0)
		r.describe = append(r.describe, d1-d0)
		r.totalState += s1 - s0
		r.totalDesc += d1 - d0
		logf("minute %d: %d DescribeInstanceStatus, %d DescribeInstances", len(r.status), s1-s0, d1-d0)
		s0, d0 = s1, d1
	}
	if p, err := w.RemediatorMetric(ctx, pollsOK); err == nil {
		r.polls = p
	} else {
		logf("polls: %v", err)
	}
	return r
}

func printEC2(o options, r ec2Result) {
	fmt.Printf("## EC2 API calls for %d instances\n\n", o.ec2Instances)
	if r.err != nil {
		fmt.Printf("Not measured: %v\n\n", r.err)
		return
	}
	iv := "1m (default)"
	if o.eventsInterval > 0 {
		iv = o.eventsInterval.String()
	}
	fmt.Printf("Counted by the emulator, per minute from the first DescribeInstanceStatus call (%s after the remediator was ready); --scheduled-events-interval %s.\n\n", r.firstPoll.Round(time.Millisecond), iv)
	fmt.Println("| minute | DescribeInstanceStatus | DescribeInstances |")
	fmt.Println("|---:|---:|---:|")
	for i := range r.status {
		fmt.Printf("| %d | %d | %d |\n", i+1, r.status[i], r.describe[i])
	}
	n := float64(len(r.status))
	fmt.Printf("| **mean per minute** | **%.1f** | **%.1f** |\n\n", float64(r.totalState)/n, float64(r.totalDesc)/n)
	if r.polls > 0 {
		fmt.Printf("The remediator completed %.0f polls (its scheduled_event_polls_total{result=\"ok\"}) by the end of the window: %.1f DescribeInstanceStatus calls per completed poll (a poll still running at the end adds its calls so far).\n\n",
			r.polls, float64(r.totalState)/r.polls)
	}
}
