// Command remediatorscale measures the remediator at fleet scale on a real control plane: N
// simulated nodes (Node objects with a kubelet-like status, a kubelet Lease and an agent Lease
// each, the Leases renewed by a load generator in this process), one real nodevigil-remediator
// process, and the EC2 emulator holding all N instances. It reports the remediator's resident
// memory and CPU while it lists and syncs, observes, runs steady and remediates; then silences
// K nodes and measures, per node, the detection latency (Lease expiry → the remediator's
// NodeSilent decision) and the termination latency (toleration expiry → TerminateInstances
// arriving at EC2). It prints Markdown tables for docs/benchmarks.md.
//
//	go run ./integration/bench/remediatorscale -nodes 10000 -silence 50
//
// kube-controller-manager is not started: its node lifecycle controller would rewrite the
// status of 10,000 Nodes (whose kubelets do not exist) and compete for the two cores; the
// remediator reads Leases first and the Ready condition only as a fallback, so nothing it
// judges depends on that controller here.
//
// Lease durations are a compromise with the machine. Real kubelets and agents renew every
// 10 s; 20,000 Leases renewed that often are ~2,000 writes/s, more than etcd and
// kube-apiserver sharing two cores with everything else can absorb. So the Leases of the nodes
// that stay healthy last -bulk-lease (300 s) and are renewed every -bulk-renew (200 s), spread
// evenly: ~100 writes/s. The remediator sees the same number of objects and the same kind of
// watch traffic, at a twentieth of the real update rate, so its steady-state CPU here is a
// lower bound of production's. The K nodes that are silenced have short Leases from the start
// (-silent-lease 10 s, renewed every -silent-renew 3 s, both Leases of a node with one
// RenewTime), so each one's expiry is exact; detection latency is measured against that
// expiry and does not depend on the bulk duration. The remediator's agentLeaseDuration is
// -bulk-lease, as it must be to match the agents', and that is also a new leader's observe
// period: five minutes of every run are spent observing.
//
// Sources of each number: RSS is VmRSS (and VmHWM, the kernel's peak) and CPU is utime+stime,
// from /proc, per phase (start-up; the rest of the leader's observe period; -steady with all
// nodes healthy; silence until -settle after the last termination). Detection latency comes
// from the remediator's JSON log ("decision changed", reason NodeSilent, millisecond
// timestamps: the precise source), cross-checked with its detection_latency_seconds histogram
// (coarse buckets) and the NodeSilent Events (FirstTimestamp has one-second resolution).
// Termination latency is the arrival of the first TerminateInstances naming the instance at a
// handler wrapped around the emulator, minus expiry + tolerations.silentNode (a second row
// measures from the remediator's own view instead, its NodeSilent log line + the toleration,
// so the last renewal's round trip and watch delivery are not counted); the remediator's
// termination_latency_seconds histogram measures to the start of the reconcile that terminates
// and is shown beside it, as is a split of the pipeline by its log lines.
//
// -batches spreads the silenced nodes over several moments (-batch-gap apart): one batch is a
// mass failure (every toleration ends in the same instant), small batches are the common case.
// -kube-api-qps, -kube-api-burst, -workers and -remediator-env tune the remediator process.
// -remediator-bin runs a given build instead of this tree's (a before/after in one load window);
// -startup-only stops once every node is judged, and -startup-profile-every (with -pprof-dir)
// takes heap profiles while the informers still list, to see what the initial lists retain.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/bench/benchmain"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/testbin"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

const agentNS = "nodevigil-system"

// options are the command's flags.
type options struct {
	nodes, silence, batches int
	batchGap                time.Duration
	bulkLease, bulkRenew    time.Duration
	silentLease, fastRenew  time.Duration
	toleration              time.Duration
	steady, sample, settle  time.Duration
	creators, renewers      int
	images                  int
	workers                 int
	kubeQPS                 float64
	kubeBurst               int
	remEnv                  envList
	countAPI                bool
	pprofDir                string
	remLog                  string
	remBin                  string
	startupEvery            time.Duration
	startupOnly             bool
}

// envList is a repeatable KEY=VALUE flag.
type envList []string

func (e *envList) String() string { return strings.Join(*e, " ") }

func (e *envList) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("%q is not KEY=VALUE", v)
	}
	*e = append(*e, v)
	return nil
}

func main() {
	var o options
	flag.IntVar(&o.nodes, "nodes", 10000, "simulated nodes")
	flag.IntVar(&o.silence, "silence", 50, "nodes to silence (both heartbeats stop), spread over the three zones")
	flag.IntVar(&o.batches, "batches", 1, "silence the nodes in this many batches")
	flag.DurationVar(&o.batchGap, "batch-gap", 20*time.Second, "time between two silence batches")
	flag.DurationVar(&o.bulkLease, "bulk-lease", 300*time.Second, "Lease duration of the nodes that stay healthy (and the remediator's agentLeaseDuration, hence its observe period)")
	flag.DurationVar(&o.bulkRenew, "bulk-renew", 200*time.Second, "renewal interval of those Leases, spread evenly")
	flag.DurationVar(&o.silentLease, "silent-lease", 10*time.Second, "Lease duration of the nodes that will be silenced")
	flag.DurationVar(&o.fastRenew, "silent-renew", 3*time.Second, "renewal interval of those Leases until they are silenced")
	flag.DurationVar(&o.toleration, "toleration", 5*time.Second, "policy tolerations.silentNode")
	flag.DurationVar(&o.steady, "steady", 2*time.Minute, "steady-state window, after the observe period, all nodes healthy")
	flag.DurationVar(&o.sample, "sample", 250*time.Millisecond, "/proc sampling interval")
	flag.DurationVar(&o.settle, "settle", 15*time.Second, "time after the last termination before counting terminations and deleted Nodes")
	flag.IntVar(&o.creators, "creators", 24, "concurrent creators during the load")
	flag.IntVar(&o.renewers, "renewers", 16, "concurrent Lease renewers")
	flag.IntVar(&o.images, "images", 30, "status.images entries per Node")
	flag.IntVar(&o.workers, "workers", 0, "remediator --workers (0: its default)")
	flag.Float64Var(&o.kubeQPS, "kube-api-qps", 0, "remediator --kube-api-qps (0: its default)")
	flag.IntVar(&o.kubeBurst, "kube-api-burst", 0, "remediator --kube-api-burst (0: its default)")
	flag.BoolVar(&o.countAPI, "count-api", true, "send the remediator through a counting proxy and report its API requests per phase")
	flag.Var(&o.remEnv, "remediator-env", "KEY=VALUE added to the remediator's environment (repeatable), e.g. GOMEMLIMIT=120MiB or KUBE_FEATURE_WatchListClient=true")
	flag.StringVar(&o.remLog, "remediator-log", "", "write the remediator's whole output (its JSON log, and e.g. GODEBUG=gctrace=1 lines) to this file at the end")
	flag.StringVar(&o.pprofDir, "pprof-dir", "", "run the remediator with --pprof-address and write profiles here: heap at /readyz, after the first judgement of every node and at the end of the steady window, CPU over the silence (stale + toleration + 20 s)")
	flag.StringVar(&o.remBin, "remediator-bin", "", "run this nodevigil-remediator binary instead of building the one of this tree (e.g. a build of an older commit, for a before/after in the same load window)")
	flag.DurationVar(&o.startupEvery, "startup-profile-every", 0, "with -pprof-dir: also take a heap profile this often while /readyz is not yet ready (heap-startup-N.pprof), to see what the initial lists retain")
	flag.BoolVar(&o.startupOnly, "startup-only", false, "stop after start-up (every node judged): print the start-up RSS and skip the observe, steady and silence phases")
	flag.Parse()
	benchmain.Main("remediatorscale", o.validate, func(ctx context.Context) error { return run(ctx, o) })
}

func (o options) validate() error {
	switch {
	case o.nodes < 3:
		return errors.New("-nodes: need at least 3 (one per zone)")
	case o.silence < 1 || o.silence*len(zones) > o.nodes:
		return fmt.Errorf("-silence: %d must be within 1..%d (a third of -nodes, so silenced nodes can be spread)", o.silence, o.nodes/len(zones))
	case o.batches < 1 || o.batches > o.silence:
		return fmt.Errorf("-batches: %d must be within 1..%d", o.batches, o.silence)
	case o.bulkRenew >= o.bulkLease || o.fastRenew >= o.silentLease:
		return errors.New("-bulk-renew and -silent-renew must be shorter than their Lease durations")
	case o.bulkLease%time.Second != 0 || o.silentLease%time.Second != 0:
		return errors.New("-bulk-lease and -silent-lease must be whole seconds (leaseDurationSeconds)")
	}
	return nil
}

// progress writes timestamped progress lines to stderr; the tables go to stdout.
type progress struct{ t0 time.Time }

func (c progress) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "remediatorscale: [%6s] %s\n", time.Since(c.t0).Round(time.Second), fmt.Sprintf(format, args...))
}

// result is everything the tables print.
type result struct {
	o                    options
	loadAtSilence        string // /proc/loadavg when the nodes were silenced
	loadAtTerminated     string // and when the last TerminateInstances arrived
	nodeJSONKiB          float64
	imagesStored         int
	loadTime             time.Duration
	readyAfter           time.Duration
	judgedAfter          time.Duration
	stages               map[string]dist
	qpsNote              string
	phases               []phaseStats
	steadyRenewRate      float64
	renewals, renewFail  int64
	staleRenewals        int64
	maxAge               time.Duration
	maxBacklog           int64
	healthyAtSteadyEnd   float64
	unexpected           []string
	intermediate         []string
	detectLog, detectEvt dist
	detectHist           histogram
	terminate            dist
	// terminateOwn is measured from the remediator's own view of the expiry: its NodeSilent
	// decision (logged when the requeue at the computed stale moment ran) plus the toleration.
	terminateOwn         dist
	terminateHist        histogram
	terminatedOnce       int
	terminatedTwice      []string
	notTerminated        []string
	falseTerminations    []string
	terminateCalls       int
	nodesDeleted         int
	heapInUseMiB         float64
	silencedZones        map[string]int
	terminationsByResult map[string]float64
	blocked              map[string]float64
	apiPhases            []string // per phase: requests counted by the proxy
	apiSteady            *apiRate
	apiSteadyServer      *apiRate // apiserver_request_total less the most the load generator can have sent
	apiSteadyServerMax   *apiRate // … less the least it can have sent
}

func run(ctx context.Context, o options) (err error) {
	c := progress{t0: time.Now()}
	res := &result{o: o}

	// No kube-controller-manager: see the package comment.
	var pkgs []string
	if o.remBin == "" {
		pkgs = append(pkgs, "github.com/nodevigil/nodevigil/remediation/cmd/nodevigil-remediator")
	}
	setup, err := benchmain.Start(ctx, "remediatorscale", c.logf, pkgs...)
	if err != nil {
		return err
	}
	defer setup.Close()
	dir, cp, bin := setup.Dir, setup.CP, o.remBin
	if bin == "" {
		bin = setup.Bins[0]
	} else {
		c.logf("remediator binary %s", bin)
	}
	rc := cp.Config()
	rc.QPS, rc.Burst = 2000, 4000
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	genReqs := &tally{}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, t: genReqs} })
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNS}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", agentNS, err)
	}

	f := newFleet(client, agentNS, o.nodes, o.silence, o.batches, o.images)
	f.bulkDur, f.bulkRenew, f.fastDur, f.fastRenew = o.bulkLease, o.bulkRenew, o.silentLease, o.fastRenew
	if data, err := json.Marshal(f.nodeObject(f.nodes[0])); err == nil {
		res.nodeJSONKiB = float64(len(data)) / 1024
	}
	c.logf("creating %d Nodes and %d Leases with %d creators", o.nodes, 2*o.nodes, o.creators)
	loadStart := time.Now()
	if err := f.load(ctx, o.creators, func(done int) { c.logf("%d nodes created", done) }); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	res.loadTime = time.Since(loadStart)
	c.logf("load took %s", res.loadTime.Round(time.Millisecond))
	if n, err := client.CoreV1().Nodes().Get(ctx, f.nodes[len(f.nodes)-1].name, metav1.GetOptions{}); err == nil {
		res.imagesStored = len(n.Status.Images)
	}

	genCtx, stopGen := context.WithCancel(ctx)
	var genWG sync.WaitGroup
	defer func() {
		stopGen()
		genWG.Wait()
	}()
	genWG.Add(2)
	go func() { defer genWG.Done(); f.runBulk(genCtx, o.renewers) }()
	go func() { defer genWG.Done(); f.runFast(genCtx) }()

	emu := ec2emu.New(ec2emu.Config{ShutdownDelay: time.Second})
	for _, n := range f.nodes {
		if err := emu.AddInstance(ec2emu.Instance{ID: n.instanceID, Zone: n.zone, Tags: map[string]string{clusterTag: "owned"}}); err != nil {
			return err
		}
	}
	rec := &terminateRecorder{emu: emu, first: map[string]time.Time{}}
	ec2srv := httptest.NewServer(rec)
	defer ec2srv.Close()

	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(remediatorConfig(o)), 0o600); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	base := "http://" + addr
	kubeconfig := cp.KubeconfigPath()
	var api *apiCounter
	if o.countAPI {
		if api, err = startAPICounter(cp.Config()); err != nil {
			return err
		}
		defer api.close()
		if kubeconfig, err = api.writeKubeconfig(dir); err != nil {
			return err
		}
	}
	snap := func() map[string]int64 {
		if api == nil {
			return nil
		}
		return api.snapshot()
	}
	args := []string{
		"--kubeconfig", kubeconfig,
		"--namespace", agentNS,
		"--config", cfgPath,
		"--listen-address", addr,
		"--metrics-secure=false",
		"--ec2-endpoint", ec2srv.URL,
		"--aws-region", "us-east-1",
		"--cluster-tag-key", clusterTag,
		"--log-format", "json",
		"--log-level", "info",
	}
	var tuning []string
	if o.workers > 0 {
		tuning = append(tuning, "--workers", fmt.Sprint(o.workers))
	}
	if o.kubeQPS > 0 {
		tuning = append(tuning, "--kube-api-qps", fmt.Sprint(o.kubeQPS))
	}
	if o.kubeBurst > 0 {
		tuning = append(tuning, "--kube-api-burst", fmt.Sprint(o.kubeBurst))
	}
	args = append(args, tuning...)
	pprofBase := ""
	if o.pprofDir != "" {
		pl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		paddr := pl.Addr().String()
		pl.Close()
		pprofBase = "http://" + paddr + "/debug/pprof/"
		args = append(args, "--pprof-address", paddr)
		if err := os.MkdirAll(o.pprofDir, 0o755); err != nil {
			return err
		}
	}
	profile := func(name, query string) {
		if pprofBase == "" {
			return
		}
		path := filepath.Join(o.pprofDir, name)
		if err := fetchProfile(ctx, pprofBase+query, path); err != nil {
			c.logf("profile %s: %v", name, err)
			return
		}
		c.logf("profile written to %s", path)
	}
	res.qpsNote = "binary defaults for --workers (16), --kube-api-qps (50), --kube-api-burst (200), --resync-period (5m)"
	if len(tuning) > 0 {
		res.qpsNote = strings.Join(tuning, " ") + "; other settings at the binary's defaults (" + strings.TrimPrefix(res.qpsNote, "binary defaults for ") + ")"
	}
	if len(o.remEnv) > 0 {
		res.qpsNote += "; environment " + o.remEnv.String()
	}
	c.logf("starting the remediator")
	remStart := time.Now()
	env := append([]string{"POD_NAME=remediatorscale", "AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench", "AWS_CA_BUNDLE="}, o.remEnv...)
	rem, err := testbin.Start("nodevigil-remediator", bin, args, env...)
	if err != nil {
		return err
	}
	defer func() {
		if e := rem.Stop(15 * time.Second); e != nil {
			fmt.Fprintln(os.Stderr, "remediatorscale: stop remediator:", e)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "remediatorscale: remediator log tail:\n%s\n", rem.LogTail(40))
		}
		if o.remLog != "" {
			if e := os.WriteFile(o.remLog, []byte(rem.Log()), 0o644); e != nil {
				fmt.Fprintln(os.Stderr, "remediatorscale: write remediator log:", e)
			}
		}
	}()
	smp := &sampler{}
	sampCtx, stopSamp := context.WithCancel(ctx)
	defer stopSamp()
	go smp.run(sampCtx, o.sample, rem.Pid(), cp.Pids())

	// Phase 1: list and sync.
	var startupWG sync.WaitGroup
	startupCtx, stopStartup := context.WithCancel(ctx)
	if pprofBase != "" && o.startupEvery > 0 {
		startupWG.Add(1)
		go func() {
			defer startupWG.Done()
			for i := 1; ; i++ {
				select {
				case <-startupCtx.Done():
					return
				case <-time.After(o.startupEvery):
				}
				profile(fmt.Sprintf("heap-startup-%02d.pprof", i), "heap")
			}
		}()
	}
	err = waitFor(ctx, rem, 10*time.Minute, func() bool { return testbin.HTTPStatus(ctx, base+"/readyz") == 200 })
	stopStartup()
	startupWG.Wait()
	if err != nil {
		return fmt.Errorf("remediator /readyz: %w", err)
	}
	readyAt := time.Now()
	res.readyAfter = readyAt.Sub(remStart)
	profile("heap-ready.pprof", "heap")
	c.logf("remediator ready (informers synced) after %s", res.readyAfter.Round(time.Millisecond))

	// Phase 2: leader, observing for one agent Lease duration.
	var leadAt time.Time
	if err := waitFor(ctx, rem, 2*time.Minute, func() bool {
		for _, r := range parseLog(rem.Log()) {
			if r.Msg == "leading: observing before judging anything stale" {
				leadAt = r.Time
				return true
			}
		}
		return false
	}); err != nil {
		return fmt.Errorf("remediator leadership: %w", err)
	}
	// A new leader judges nothing stale for one agent Lease duration plus its grace.
	observeEnd := leadAt.Add(decide.StaleAfter(o.bulkLease))
	c.logf("leading since %s; observing until %s", leadAt.Format(time.TimeOnly), observeEnd.Format(time.TimeOnly))
	// The first pass over every node is done when the census (refreshed every 10 s) counts them.
	if err := waitFor(ctx, rem, 5*time.Minute, func() bool {
		m, err := scrape(ctx, base)
		return err == nil && m.get("nodevigil_remediator_nodes") >= float64(o.nodes)
	}); err != nil {
		return fmt.Errorf("remediator census: %w", err)
	}
	syncEnd := time.Now()
	res.judgedAfter = syncEnd.Sub(remStart)
	profile("heap-judged.pprof", "heap")
	res.phases = append(res.phases, smp.phase("start-up: list, sync, lead, first judgement of every node", remStart, syncEnd))
	if o.startupOnly {
		p := res.phases[0]
		m, err := scrape(ctx, base)
		if err != nil {
			return err
		}
		fmt.Printf("| remediator | %s |\n", res.qpsNote)
		fmt.Printf("| start-up | /readyz after %s; every node judged after %s |\n", res.readyAfter.Round(time.Millisecond), res.judgedAfter.Round(time.Millisecond))
		fmt.Printf("| RSS %s (%s) | median %.1f MiB · max %.1f MiB (%s in) · VmHWM %.1f MiB · CPU %.0f mCPU |\n", p.name, p.dur.Round(time.Second), p.rssMedian, p.rssMax, p.maxAfter.Round(100*time.Millisecond), p.hwm, p.remCPU)
		fmt.Printf("| Go heap at the end of start-up | in use %.1f MiB · allocated since start %.1f MiB in %.0f objects |\n",
			m.get("go_memstats_heap_inuse_bytes")/(1<<20), m.get("go_memstats_alloc_bytes_total")/(1<<20), m.get("go_memstats_mallocs_total"))
		return nil
	}
	apiSync := snap()
	if err := sleepWatch(ctx, rem, time.Until(observeEnd.Add(5*time.Second))); err != nil {
		return err
	}
	res.phases = append(res.phases, smp.phase("observe: rest of the observe period", syncEnd, time.Now()))
	apiObserve := snap()

	// Phase 3: steady state.
	// The load generator's requests are read on both sides of each apiserver scrape: the
	// apiserver counted them at some moment in between, so the rest is known within a range.
	gen0lo := genReqs.snapshot()
	srv0, err := apiserverCounts(ctx, cp.Config())
	if err != nil {
		return err
	}
	gen0hi := genReqs.snapshot()
	steadyStart := time.Now()
	renew0 := f.renewals.Load()
	c.logf("steady state for %s", o.steady)
	if err := sleepWatch(ctx, rem, o.steady); err != nil {
		return err
	}
	steadyEnd := time.Now()
	profile("heap-steady.pprof", "heap")
	res.steadyRenewRate = float64(f.renewals.Load()-renew0) / steadyEnd.Sub(steadyStart).Seconds()
	res.phases = append(res.phases, smp.phase("steady: all nodes healthy", steadyStart, steadyEnd))
	apiSteady := snap()
	gen1lo := genReqs.snapshot()
	srv1, err := apiserverCounts(ctx, cp.Config())
	if err != nil {
		return err
	}
	gen1hi := genReqs.snapshot()
	// Least and most the generator can have sent between the two scrapes.
	lo := serverSideRate(srv0, srv1, gen0lo, gen1hi, steadyEnd.Sub(steadyStart))
	hi := serverSideRate(srv0, srv1, gen0hi, gen1lo, steadyEnd.Sub(steadyStart))
	res.apiSteadyServer, res.apiSteadyServerMax = &lo, &hi
	baseline, err := scrape(ctx, base)
	if err != nil {
		return err
	}
	res.healthyAtSteadyEnd = baseline.get("nodevigil_remediator_nodes", `reason="Healthy"`)
	res.heapInUseMiB = baseline.get("go_memstats_heap_inuse_bytes") / (1 << 20)

	// Phase 4: silence K nodes and watch them be remediated.
	silenced := f.silenced()
	expiry := map[string]time.Time{}
	res.silencedZones = map[string]int{}
	var mu sync.Mutex
	silenceStart := time.Now()
	res.loadAtSilence = benchmain.LoadAvg()
	var profWG sync.WaitGroup
	defer profWG.Wait()
	if pprofBase != "" {
		secs := int((decide.StaleAfter(o.silentLease) + o.toleration + time.Duration(o.batches-1)*o.batchGap + 20*time.Second).Seconds())
		profWG.Add(1)
		go func() {
			defer profWG.Done()
			profile("cpu-silence.pprof", fmt.Sprintf("profile?seconds=%d", secs))
		}()
	}
	for b := range o.batches {
		if err := sleepWatch(ctx, rem, time.Until(silenceStart.Add(time.Duration(b)*o.batchGap))); err != nil {
			return err
		}
		var wg sync.WaitGroup
		var batch int
		for _, n := range silenced {
			if n.batch != b {
				continue
			}
			batch++
			wg.Add(1)
			go func() {
				defer wg.Done()
				exp, err := f.silence(ctx, n)
				if err != nil {
					c.logf("silencing %s: %v (expiry taken from the last accepted renewal)", n.name, err)
				}
				mu.Lock()
				expiry[n.name] = exp
				res.silencedZones[n.zone]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		c.logf("batch %d: silenced %d nodes", b+1, batch)
	}
	var lastExpiry time.Time
	for _, e := range expiry {
		if e.After(lastExpiry) {
			lastExpiry = e
		}
	}
	if pprofBase != "" {
		// Where the workers wait while the silenced nodes are due: goroutine stacks 1 s and
		// 3 s after the last toleration expired (a CPU profile shows only CPU, and the
		// remediator spends little of it here).
		due := lastExpiry.Add(o.toleration)
		profWG.Add(1)
		go func() {
			defer profWG.Done()
			for i, d := range []time.Duration{time.Second, 3 * time.Second} {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(due.Add(d))):
				}
				profile(fmt.Sprintf("goroutines-due-%d.txt", i+1), "goroutine?debug=1")
			}
		}()
	}
	deadline := lastExpiry.Add(o.toleration + 3*time.Minute)
	c.logf("waiting for %d TerminateInstances (last Lease expiry %s)", len(silenced), lastExpiry.Format(time.TimeOnly))
	if err := waitFor(ctx, rem, time.Until(deadline), func() bool {
		for _, n := range silenced {
			if _, ok := rec.arrival(n.instanceID); !ok {
				return false
			}
		}
		return true
	}); err != nil {
		c.logf("not every silenced instance was terminated: %v", err)
	}
	res.loadAtTerminated = benchmain.LoadAvg()
	if err := sleepWatch(ctx, rem, o.settle); err != nil {
		return err
	}
	silenceEnd := time.Now()
	res.phases = append(res.phases, smp.phase("silence: first silence → settled", silenceStart, silenceEnd))
	if api != nil {
		apiEnd := api.snapshot()
		r := rateBetween(apiObserve, apiSteady, steadyEnd.Sub(steadyStart))
		res.apiSteady = &r
		res.apiPhases = []string{
			"start-up: " + countsBetween(nil, apiSync),
			"observe: " + countsBetween(apiSync, apiObserve),
			"silence: " + countsBetween(apiSteady, apiEnd),
		}
	}
	final, err := scrape(ctx, base)
	if err != nil {
		return err
	}

	// Detection latency, three ways.
	isSilenced := map[string]*simNode{}
	for _, n := range silenced {
		isSilenced[n.name] = n
	}
	detectedAt := map[string]time.Time{}
	for _, r := range parseLog(rem.Log()) {
		if r.Msg != "decision changed" {
			continue
		}
		if _, ok := isSilenced[r.Node]; !ok {
			res.unexpected = append(res.unexpected, r.Node+" "+r.Reason)
			continue
		}
		switch {
		case r.Reason == "NodeSilent":
			if _, seen := detectedAt[r.Node]; !seen {
				detectedAt[r.Node] = r.Time
			}
		case r.Time.After(silenceStart):
			res.intermediate = append(res.intermediate, r.Node+" "+r.Reason)
		}
	}
	for name, at := range detectedAt {
		res.detectLog = append(res.detectLog, at.Sub(expiry[name]))
	}
	res.detectHist = final.histogram("nodevigil_remediator_detection_latency_seconds", baseline, `reason="NodeSilent"`)
	evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "reason=NodeSilent"})
	if err != nil {
		return fmt.Errorf("list NodeSilent events: %w", err)
	}
	evAt := map[string]time.Time{}
	for _, ev := range evs.Items {
		if _, ok := isSilenced[ev.InvolvedObject.Name]; !ok {
			continue
		}
		if t, seen := evAt[ev.InvolvedObject.Name]; !seen || ev.FirstTimestamp.Time.Before(t) {
			evAt[ev.InvolvedObject.Name] = ev.FirstTimestamp.Time
		}
	}
	for name, at := range evAt {
		res.detectEvt = append(res.detectEvt, at.Sub(expiry[name]))
	}

	// Where the termination latency goes, from the pipeline's log lines (ms precision).
	marked, cordoned := map[string]time.Time{}, map[string]time.Time{}
	for _, r := range parseLog(rem.Log()) {
		var m map[string]time.Time
		switch r.Msg {
		case "remediation started":
			m = marked
		case "node cordoned":
			m = cordoned
		default:
			continue
		}
		if _, ok := isSilenced[r.Node]; ok && r.Time.After(silenceStart) {
			if _, seen := m[r.Node]; !seen {
				m[r.Node] = r.Time
			}
		}
	}
	res.stages = map[string]dist{}
	for _, n := range silenced {
		eligible := expiry[n.name].Add(o.toleration)
		mk, ok1 := marked[n.name]
		cd, ok2 := cordoned[n.name]
		at, ok3 := rec.arrival(n.instanceID)
		if ok1 {
			res.stages[stageMarked] = append(res.stages[stageMarked], mk.Sub(eligible))
		}
		if ok1 && ok2 {
			res.stages[stageCordoned] = append(res.stages[stageCordoned], cd.Sub(mk))
		}
		if ok2 && ok3 {
			res.stages[stageEC2] = append(res.stages[stageEC2], at.Sub(cd))
		}
	}

	// Termination latency and exactly-once.
	for _, n := range silenced {
		if at, ok := rec.arrival(n.instanceID); ok {
			res.terminate = append(res.terminate, at.Sub(expiry[n.name].Add(o.toleration)))
			if d, ok := detectedAt[n.name]; ok {
				res.terminateOwn = append(res.terminateOwn, at.Sub(d.Add(o.toleration)))
			}
		} else {
			res.notTerminated = append(res.notTerminated, n.name)
		}
		switch t := emu.Terminations(n.instanceID); {
		case t == 1:
			res.terminatedOnce++
		case t > 1:
			res.terminatedTwice = append(res.terminatedTwice, fmt.Sprintf("%s×%d", n.instanceID, t))
		}
		if _, err := client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			res.nodesDeleted++
		}
	}
	for _, n := range f.nodes {
		if !n.silenced && emu.Terminations(n.instanceID) > 0 {
			res.falseTerminations = append(res.falseTerminations, n.instanceID)
		}
	}
	res.terminateCalls = len(emu.TerminateCalls())
	res.terminateHist = final.histogram("nodevigil_remediator_termination_latency_seconds", baseline)
	res.terminationsByResult = diffBy(final, baseline, "nodevigil_remediator_terminations_total", "result")
	res.blocked = diffBy(final, baseline, "nodevigil_remediator_blocked_total", "reason")
	res.renewals, res.renewFail = f.renewals.Load(), f.renewFailures.Load()
	res.staleRenewals, res.maxAge, res.maxBacklog = f.staleRenewals.Load(), time.Duration(f.maxAge.Load()), f.maxBacklog.Load()

	printTables(os.Stdout, res)
	switch {
	case len(res.falseTerminations) > 0:
		return fmt.Errorf("%d healthy instances were terminated", len(res.falseTerminations))
	case len(res.notTerminated) > 0 || len(res.terminatedTwice) > 0:
		return fmt.Errorf("silenced instances not terminated exactly once: never %v, more than once %v", res.notTerminated, res.terminatedTwice)
	}
	return nil
}

// Termination stages, as printed.
const (
	stageMarked   = "toleration expiry → marked (rails checked, first patch done)"
	stageCordoned = "marked → cordoned (second patch)"
	stageEC2      = "cordoned → TerminateInstances at EC2 (rate-limit token, third patch, batch window, Describe)"
)

var stageOrder = []string{stageMarked, stageCordoned, stageEC2}

// diffBy returns the increase of each series of a counter, keyed by one label's value.
func diffBy(now, before metrics, name, label string) map[string]float64 {
	out := map[string]float64{}
	for labels, v := range now[name] {
		d := v - before[name][labels]
		if d == 0 {
			continue
		}
		key := labels
		if i := strings.Index(labels, label+`="`); i >= 0 {
			key = labels[i+len(label)+2:]
			key = key[:strings.IndexByte(key, '"')]
		}
		out[key] += d
	}
	return out
}

// remediatorConfig is the RemediatorConfig: one Terminate policy over the whole pool, rails
// set above the silenced share so that they do not block (they are measured elsewhere), drain
// off so that termination is not gated on pods.
func remediatorConfig(o options) string {
	pct := max(5, (200*o.silence+o.nodes-1)/o.nodes) // twice the silenced share, at least 5%
	pct = min(pct, 100)
	return fmt.Sprintf(`apiVersion: nodevigil.io/v1alpha1
kind: RemediatorConfig
dryRun: false
agentNamespace: %s
agentLeaseDuration: %s
terminationRateLimit:
  perMinute: 6000
  burst: %d
zonePauseThreshold: %d%%
clusterPauseThreshold: %d%%
policies:
- name: %s
  nodeSelector: %s=%s
  action: Terminate
  tolerations:
    silentNode: %s
    kubeletUnhealthy: 10m
  startupGrace: 1s
  startupDeadline: 20m
  drain:
    enabled: false
  maxUnhealthy: %d%%
  maxInFlight: %d
- name: others
  nodeSelector: ""
  action: None
`, agentNS, o.bulkLease, max(100, o.silence), pct, pct, poolName, poolLabel, poolName, o.toleration, pct, o.silence)
}

// waitFor polls cond until it holds, the remediator exits, ctx ends or timeout passes.
func waitFor(ctx context.Context, p *testbin.Process, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return nil
		}
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("remediator exited: %v", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// sleepWatch waits d, failing early if the remediator exits or ctx ends.
func sleepWatch(ctx context.Context, p *testbin.Process, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("remediator exited: %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Second, time.Until(end))):
		}
	}
	return nil
}

func printTables(w *os.File, r *result) {
	o := r.o
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	fmt.Fprintf(w, "`%s`\n\n", strings.Join(os.Args, " "))
	fmt.Fprintf(w, "| metric | value |\n|---|---|\n")
	fmt.Fprintf(w, "| nodes | %d (3 zones, one pool); %d silenced in %d batch(es), by zone %v |\n", o.nodes, o.silence, o.batches, r.silencedZones)
	fmt.Fprintf(w, "| objects | %d Nodes (%d status.images each, %d stored; %.1f KiB as JSON) + %d Leases (kubelet + agent) |\n",
		o.nodes, o.images, r.imagesStored, r.nodeJSONKiB, 2*o.nodes)
	fmt.Fprintf(w, "| load time | %s for %d objects (%.0f objects/s, %d creators, client QPS 2000) |\n",
		ms(r.loadTime), 3*o.nodes, float64(3*o.nodes)/r.loadTime.Seconds(), o.creators)
	bulkRate := float64(2*(o.nodes-o.silence)) / o.bulkRenew.Seconds()
	fastRate := float64(2*o.silence) / o.fastRenew.Seconds()
	fmt.Fprintf(w, "| lease renewal | healthy nodes: leaseDurationSeconds %d renewed every %s, spread evenly ⇒ %.0f writes/s; silenced nodes before silence: %d s every %s ⇒ %.1f writes/s; measured in steady state %.1f writes/s (real kubelets/agents: 2 per node per 10 s = %.0f writes/s) |\n",
		int(o.bulkLease.Seconds()), o.bulkRenew, bulkRate, int(o.silentLease.Seconds()), o.fastRenew, fastRate, r.steadyRenewRate, float64(2*o.nodes)/10)
	fmt.Fprintf(w, "| renewal health | %d renewals, %d failed, %d found their Lease already expired, longest gap %s, max backlog %d |\n",
		r.renewals, r.renewFail, r.staleRenewals, r.maxAge.Round(time.Second), r.maxBacklog)
	fmt.Fprintf(w, "| remediator | %s; silentNode %s, drain off, agentLeaseDuration %s (= observe period) |\n",
		r.qpsNote, o.toleration, o.bulkLease)
	fmt.Fprintf(w, "| start-up | /readyz (informers synced) after %s; every node judged (census) after %s |\n", ms(r.readyAfter), ms(r.judgedAfter))
	fmt.Fprintf(w, "| healthy at end of steady state | %.0f of %d (`nodevigil_remediator_nodes{reason=\"Healthy\"}`) |\n", r.healthyAtSteadyEnd, o.nodes)
	fmt.Fprintf(w, "| Go heap in use, end of steady state | %.1f MiB |\n", r.heapInUseMiB)
	for _, p := range r.phases {
		fmt.Fprintf(w, "| RSS %s (%s) | median %.1f MiB · max %.1f MiB (%s in) · VmHWM %.1f MiB |\n", p.name, p.dur.Round(time.Second), p.rssMedian, p.rssMax, p.maxAfter.Round(100*time.Millisecond), p.hwm)
	}
	for _, p := range r.phases {
		fmt.Fprintf(w, "| CPU %s | remediator %.0f mCPU · etcd+apiserver %.0f mCPU · load generator %.0f mCPU |\n", p.name, p.remCPU, p.cpCPU, p.genCPU)
	}
	if r.apiSteadyServer != nil {
		fmt.Fprintf(w, "| API requests, steady: all nodes healthy, apiserver-side (apiserver_request_total less the load generator's own requests: the remediator plus kube-apiserver's own loopback clients; at least) | %s |\n", r.apiSteadyServer)
		fmt.Fprintf(w, "| API requests, same, at most (the generator's requests during each scrape counted as the apiserver's) | %s |\n", r.apiSteadyServerMax)
	}
	if r.apiSteady != nil {
		fmt.Fprintf(w, "| API requests of the remediator, steady: all nodes healthy (counting proxy) | %s |\n", r.apiSteady)
		for _, p := range r.apiPhases {
			fmt.Fprintf(w, "| API requests of the remediator, %s |\n", strings.Replace(p, ": ", " | ", 1))
		}
	}
	fmt.Fprintf(w, "| detection latency, remediator log (ms) | %s |\n", r.detectLog)
	fmt.Fprintf(w, "| detection latency, histogram | n=%.0f · mean %s · p50 ≈ %s · p99 ≈ %s |\n",
		r.detectHist.count, meanOf(r.detectHist), r.detectHist.quantile(0.5), r.detectHist.quantile(0.99))
	fmt.Fprintf(w, "| detection latency, NodeSilent Events (FirstTimestamp is truncated to the second: ±1 s) | %s |\n", r.detectEvt)
	fmt.Fprintf(w, "| termination latency, EC2 arrival − (stale + toleration) | %s |\n", r.terminate)
	fmt.Fprintf(w, "| termination latency from the remediator's own expiry: EC2 arrival − (NodeSilent logged + toleration); without the last renewal's round trip and watch delivery (the detection row), which the row above counts | %s |\n", r.terminateOwn)
	for _, st := range stageOrder {
		fmt.Fprintf(w, "| termination stage %s | %s |\n", st, r.stages[st])
	}
	fmt.Fprintf(w, "| termination latency, histogram (to the reconcile that terminates) | n=%.0f · mean %s · p50 ≈ %s · p99 ≈ %s |\n",
		r.terminateHist.count, meanOf(r.terminateHist), r.terminateHist.quantile(0.5), r.terminateHist.quantile(0.99))
	fmt.Fprintf(w, "| terminated exactly once | %d of %d (more than once: %v; never: %v); %d TerminateInstances calls carried out |\n",
		r.terminatedOnce, o.silence, r.terminatedTwice, r.notTerminated, r.terminateCalls)
	fmt.Fprintf(w, "| false terminations | %d %v |\n", len(r.falseTerminations), r.falseTerminations)
	fmt.Fprintf(w, "| Nodes deleted after termination | %d of %d |\n", r.nodesDeleted, o.silence)
	fmt.Fprintf(w, "| terminations_total / blocked_total during silence | %v / %v |\n", r.terminationsByResult, r.blocked)
	fmt.Fprintf(w, "| other verdicts | silenced nodes before NodeSilent: %d %v; healthy nodes: %d %v |\n",
		len(r.intermediate), head(r.intermediate), len(r.unexpected), head(r.unexpected))
	fmt.Fprintf(w, "| machine | %s/%s, %d CPUs, %s |\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(w, "| load average (1, 5, 15 min) when the nodes were silenced → when the last TerminateInstances arrived | %s → %s |\n", r.loadAtSilence, r.loadAtTerminated)
}

func meanOf(h histogram) string {
	if h.count == 0 {
		return "n/a"
	}
	return (time.Duration(h.sum / h.count * float64(time.Second))).Round(time.Millisecond).String()
}

func head(s []string) []string {
	if len(s) > 5 {
		return append(s[:5:5], "…")
	}
	return s
}

// fetchProfile GETs a pprof URL into path.
func fetchProfile(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
