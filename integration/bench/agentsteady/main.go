// Command agentsteady measures the agent in steady state on a real control plane: its resident
// memory and CPU, sampled from /proc, and the API requests it makes per minute, counted from
// the apiserver's own apiserver_request_total (the controller manager is not started, so the
// agent is the only writer). It prints a Markdown table for docs/benchmarks.md.
//
// By default a lease floor runs in the same window (floor.go): a process that only renews a
// Lease with the agent's own heartbeat code. Its CPU is what any agent that heartbeats through
// client-go costs here, so "agent above the lease floor" is the part the agent's own work adds,
// a figure that moves far less with this host's noisy minutes than the agent's own.
//
//	go run ./integration/bench/agentsteady -duration 10m
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/bench/benchmain"
	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/fakeproc"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

func main() {
	duration := flag.Duration("duration", 10*time.Minute, "steady-state measurement window (after warm-up)")
	warmup := flag.Duration("warmup", time.Minute, "time before measuring, for start-up allocations and the first reports")
	sample := flag.Duration("sample", 5*time.Second, "RSS sampling interval")
	baseline := flag.Duration("baseline", 2*time.Minute, "window before the agent starts, to measure the apiserver's own requests (its identity Lease) and subtract them")
	compare := flag.Bool("compare", false, "run a second agent on a second Node with the AWS event checks off (imds.disabled: true) alongside, and report its RSS and CPU: the IMDS watcher's cost at the same time and load (the API rows then count both agents)")
	spotInterval := flag.Duration("spot-interval", 0, "imds.spotInterval for the measured agent (0: the agent's default, 2s)")
	lifecycle := flag.String("lifecycle", "spot", "the emulated instance's purchasing option (instance-life-cycle): spot (the agent polls the spot paths every spot interval) or on-demand (it never reads them)")
	ab := flag.String("ab", "", "path of another build's nodevigil-agent binary (e.g. main's: git worktree add, go build -o); it runs alongside on a Node and emulated instance of its own with the same settings, and its rows (\"A/B:\") give a same-window A/B on one control plane")
	imdsOn := flag.Bool("imds", true, "serve the agent an emulated instance metadata service (integration/ec2emu), so the AWS event watcher polls as on EC2; false leaves the default endpoint, unreachable off EC2")
	floor := flag.Bool("floor", true, "run the lease floor alongside (a process that only renews a Lease with the agent's own heartbeat code, GOMAXPROCS 1, GOGC 50) and report the agents' CPU above it, in the same window")
	role := flag.String("role", "", "internal: "+roleLeaseFloor+" runs the lease floor itself (with -kubeconfig, -node, -namespace)")
	kubeconfig := flag.String("kubeconfig", "", "internal: the lease floor's kubeconfig")
	node := flag.String("node", "", "internal: the lease floor's Node")
	namespace := flag.String("namespace", "", "internal: the lease floor's namespace")
	flag.Parse()
	if *role == roleLeaseFloor {
		if err := runLeaseFloor(*kubeconfig, *node, *namespace); err != nil {
			fmt.Fprintln(os.Stderr, "agentsteady lease floor:", err)
			os.Exit(1)
		}
		return
	}
	if *lifecycle != "spot" && *lifecycle != "on-demand" {
		fmt.Fprintf(os.Stderr, "agentsteady: -lifecycle %q: want spot or on-demand\n", *lifecycle)
		os.Exit(2)
	}
	if err := run(*duration, *warmup, *sample, *baseline, *imdsOn, *compare, *floor, *spotInterval, *lifecycle, *ab); err != nil {
		fmt.Fprintln(os.Stderr, "agentsteady:", err)
		os.Exit(1)
	}
}

func run(duration, warmup, sample, baseline time.Duration, imdsOn, compare, floor bool, spotInterval time.Duration, lifecycle, abBin string) error {
	ctx := context.Background()
	cp, err := controlplane.Start(ctx, controlplane.Config{DisableControllerManager: true})
	if err != nil {
		return err
	}
	defer cp.Stop()
	client, err := cp.Client()
	if err != nil {
		return err
	}
	const nodeName, ns = "bench-node", "nodevigil-system"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "nodevigil-agentsteady-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := writeHost(filepath.Join(dir, "host")); err != nil {
		return err
	}
	healthz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	defer healthz.Close()
	bin, err := testbin.Build(ctx, "github.com/nodevigil/nodevigil/agent/cmd/nodevigil-agent", dir, false)
	if err != nil {
		return err
	}
	// The apiserver renews its own identity Lease and the like; measure that first, without
	// the agent, so the agent's share can be told apart.
	fmt.Fprintf(os.Stderr, "agentsteady: measuring the apiserver's own requests for %s\n", baseline)
	base0, err := requestCounts(ctx, cp.Config())
	if err != nil {
		return err
	}
	baseStart := time.Now()
	time.Sleep(baseline)
	base1, err := requestCounts(ctx, cp.Config())
	if err != nil {
		return err
	}
	baseMinutes := time.Since(baseStart).Minutes()
	metricsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	// Default intervals: this measures what a real node would do. The IMDS watcher is on by
	// default; an emulated metadata service makes it poll (on a spot instance, spot and
	// rebalance every 2 s) as on EC2, where off EC2 it would only back off against an unreachable address.
	args := []string{"run",
		"--node-name", nodeName, "--namespace", ns, "--pod-name", "agent-bench",
		"--kubeconfig", cp.KubeconfigPath(), "--host-root", filepath.Join(dir, "host"),
		"--listen-address", metricsAddr, "--kubelet-healthz-url", healthz.URL + "/healthz",
		"--log-level", "warn",
	}
	const instanceID = "i-0b0000000000000a1"
	emu := ec2emu.New(ec2emu.Config{})
	if imdsOn {
		in := ec2emu.Instance{ID: instanceID}
		if lifecycle == "spot" {
			in.Lifecycle = ec2emu.LifecycleSpot
		}
		if err := emu.AddInstance(in); err != nil {
			return err
		}
		md := httptest.NewServer(emu.IMDSHandler(instanceID))
		defer md.Close()
		args = append(args, "--imds-endpoint", md.URL)
		if spotInterval > 0 {
			conf := filepath.Join(dir, "imds.yaml")
			if err := os.WriteFile(conf, fmt.Appendf(nil, "apiVersion: nodevigil.io/v1alpha1\nkind: AgentConfig\nimds:\n  spotInterval: %s\n", spotInterval), 0o600); err != nil {
				return err
			}
			args = append(args, "--config", conf)
		}
	}
	agent, err := testbin.Start("nodevigil-agent", bin, args)
	if err != nil {
		return err
	}
	defer agent.Stop(10 * time.Second)
	var other *testbin.Process
	var otherAddr string
	if compare {
		const otherNode = "bench-node-2"
		if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: otherNode}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		conf := filepath.Join(dir, "no-imds.yaml")
		if err := os.WriteFile(conf, []byte("apiVersion: nodevigil.io/v1alpha1\nkind: AgentConfig\nimds:\n  disabled: true\n"), 0o600); err != nil {
			return err
		}
		otherAddr, err = freeAddr()
		if err != nil {
			return err
		}
		other, err = testbin.Start("nodevigil-agent-noimds", bin, []string{"run",
			"--node-name", otherNode, "--namespace", ns, "--pod-name", "agent-bench-2",
			"--kubeconfig", cp.KubeconfigPath(), "--host-root", filepath.Join(dir, "host"),
			"--listen-address", otherAddr, "--kubelet-healthz-url", healthz.URL + "/healthz",
			"--log-level", "warn", "--config", conf,
		})
		if err != nil {
			return err
		}
		defer other.Stop(10 * time.Second)
	}

	var abAgent *testbin.Process
	var abAddr string
	const abInstance = "i-0b0000000000000b2"
	if abBin != "" {
		const abNode = "bench-node-ab"
		if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: abNode}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if abAddr, err = freeAddr(); err != nil {
			return err
		}
		abArgs := []string{"run",
			"--node-name", abNode, "--namespace", ns, "--pod-name", "agent-bench-ab",
			"--kubeconfig", cp.KubeconfigPath(), "--host-root", filepath.Join(dir, "host"),
			"--listen-address", abAddr, "--kubelet-healthz-url", healthz.URL + "/healthz",
			"--log-level", "warn",
		}
		if imdsOn {
			in := ec2emu.Instance{ID: abInstance}
			if lifecycle == "spot" {
				in.Lifecycle = ec2emu.LifecycleSpot
			}
			if err := emu.AddInstance(in); err != nil {
				return err
			}
			md := httptest.NewServer(emu.IMDSHandler(abInstance))
			defer md.Close()
			abArgs = append(abArgs, "--imds-endpoint", md.URL)
			if spotInterval > 0 {
				abArgs = append(abArgs, "--config", filepath.Join(dir, "imds.yaml"))
			}
		}
		if abAgent, err = testbin.Start("nodevigil-agent-ab", abBin, abArgs); err != nil {
			return err
		}
		defer abAgent.Stop(10 * time.Second)
	}

	var floorProc *testbin.Process
	if floor {
		const floorNode = "bench-node-floor"
		if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: floorNode}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		if floorProc, err = testbin.Start("lease-floor", self, []string{"-role", roleLeaseFloor,
			"-kubeconfig", cp.KubeconfigPath(), "-node", floorNode, "-namespace", ns}); err != nil {
			return err
		}
		defer floorProc.Stop(10 * time.Second)
	}

	fmt.Fprintf(os.Stderr, "agentsteady: warming up for %s, then measuring for %s\n", warmup, duration)
	time.Sleep(warmup)
	if exited, err := agent.Exited(); exited {
		return fmt.Errorf("agent exited during warm-up: %v\n%s", err, agent.LogTail(30))
	}
	if other != nil {
		if exited, err := other.Exited(); exited {
			return fmt.Errorf("comparison agent exited during warm-up: %v\n%s", err, other.LogTail(30))
		}
	}
	if abAgent != nil {
		if exited, err := abAgent.Exited(); exited {
			return fmt.Errorf("A/B agent exited during warm-up: %v\n%s", err, abAgent.LogTail(30))
		}
	}
	if floorProc != nil {
		if exited, err := floorProc.Exited(); exited {
			return fmt.Errorf("lease floor exited during warm-up: %v\n%s", err, floorProc.LogTail(30))
		}
	}
	// The figures mean something only for an agent whose node checks pass, as on a working
	// node: an Unknown check (a fixture it could not read) costs less than a real one.
	for _, m := range []struct{ name, addr string }{{"agent", metricsAddr}, {"comparison agent", otherAddr}, {"A/B agent", abAddr}} {
		if m.addr == "" {
			continue
		}
		if err := nodeChecksHealthy(ctx, m.addr); err != nil {
			return fmt.Errorf("%s after warm-up: %w", m.name, err)
		}
	}
	before, err := requestCounts(ctx, cp.Config())
	if err != nil {
		return err
	}
	cpu0, err := cpuTicks(agent.Pid())
	if err != nil {
		return err
	}
	renew0, err := scrapeSum(ctx, "http://"+metricsAddr+"/metrics", `nodevigil_agent_lease_renewals_total{result="success"}`)
	if err != nil {
		return err
	}
	var ocpu0 int64
	if other != nil {
		if ocpu0, err = cpuTicks(other.Pid()); err != nil {
			return err
		}
	}
	// Context switches: a count, not a time, so robust to the machine's load: mostly the
	// agent's wake-ups (each costs the runtime's sysmon thread a few more).
	cs0, ocs0 := switches(agent.Pid()), int64(0)
	if other != nil {
		ocs0 = switches(other.Pid())
	}
	// Scheduler counts and the Go runtime's own (allocations, GC cycles): load-robust
	// figures a same-window A/B can be read from even on a busy machine.
	load0 := benchmain.LoadAvg()
	rt0, ort0, abrt0 := runtimeCounts(ctx, metricsAddr), runtimeCounts(ctx, otherAddr), runtimeCounts(ctx, abAddr)
	ps0, ops0, abps0 := readSched(agent.Pid()), sched{}, sched{}
	if other != nil {
		ops0 = readSched(other.Pid())
	}
	var abcpu0 int64
	if abAgent != nil {
		abps0 = readSched(abAgent.Pid())
		if abcpu0, err = cpuTicks(abAgent.Pid()); err != nil {
			return err
		}
	}
	var floor0 sched
	if floorProc != nil {
		floor0 = readSched(floorProc.Pid())
	}
	abTokens0, abReads0 := emu.IMDSCalls(abInstance)
	var abrss []int64
	tokens0, reads0 := emu.IMDSCalls(instanceID)
	start := time.Now()
	var rss, anon, file, orss, oanon, ofile []int64
	// Scheduler counts at every whole minute of the window, for the per-minute median: one
	// minute's CPU can read several times another's on a host that reports no steal time.
	minutes0 := []sched{ps0}
	abMinutes, floorMinutes := []sched{abps0}, []sched{floor0}
	for time.Since(start) < duration {
		if time.Since(start) >= time.Duration(len(minutes0))*time.Minute {
			minutes0 = append(minutes0, readSched(agent.Pid()))
			if abAgent != nil {
				abMinutes = append(abMinutes, readSched(abAgent.Pid()))
			}
			if floorProc != nil {
				floorMinutes = append(floorMinutes, readSched(floorProc.Pid()))
			}
		}
		m, err := memKB(agent.Pid())
		if err != nil {
			return fmt.Errorf("agent gone: %w\n%s", err, agent.LogTail(30))
		}
		rss, anon, file = append(rss, m["VmRSS"]), append(anon, m["RssAnon"]), append(file, m["RssFile"])
		if other != nil {
			m, err := memKB(other.Pid())
			if err != nil {
				return fmt.Errorf("comparison agent gone: %w\n%s", err, other.LogTail(30))
			}
			orss, oanon, ofile = append(orss, m["VmRSS"]), append(oanon, m["RssAnon"]), append(ofile, m["RssFile"])
		}
		if abAgent != nil {
			m, err := memKB(abAgent.Pid())
			if err != nil {
				return fmt.Errorf("A/B agent gone: %w\n%s", err, abAgent.LogTail(30))
			}
			abrss = append(abrss, m["VmRSS"])
		}
		time.Sleep(sample)
	}
	renew1, err := scrapeSum(ctx, "http://"+metricsAddr+"/metrics", `nodevigil_agent_lease_renewals_total{result="success"}`)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	tokens1, reads1 := emu.IMDSCalls(instanceID)
	cpu1, err := cpuTicks(agent.Pid())
	if err != nil {
		return err
	}
	after, err := requestCounts(ctx, cp.Config())
	if err != nil {
		return err
	}
	var ocpu1 int64
	if other != nil {
		if ocpu1, err = cpuTicks(other.Pid()); err != nil {
			return err
		}
	}
	cs1, ocs1 := switches(agent.Pid()), int64(0)
	if other != nil {
		ocs1 = switches(other.Pid())
	}
	ps1, ops1, abps1 := readSched(agent.Pid()), sched{}, sched{}
	if other != nil {
		ops1 = readSched(other.Pid())
	}
	var abcpu1 int64
	if abAgent != nil {
		abps1 = readSched(abAgent.Pid())
		if abcpu1, err = cpuTicks(abAgent.Pid()); err != nil {
			return err
		}
	}
	var floor1 sched
	if floorProc != nil {
		if exited, err := floorProc.Exited(); exited {
			return fmt.Errorf("lease floor exited during the window: %v\n%s", err, floorProc.LogTail(30))
		}
		floor1 = readSched(floorProc.Pid())
	}
	abTokens1, abReads1 := emu.IMDSCalls(abInstance)
	rt1, ort1, abrt1 := runtimeCounts(ctx, metricsAddr), runtimeCounts(ctx, otherAddr), runtimeCounts(ctx, abAddr)
	for _, v := range [][]int64{rss, anon, file, orss, oanon, ofile, abrss} {
		slices.Sort(v)
	}
	minutes := elapsed.Minutes()
	const ticksPerSecond = 100 // USER_HZ on Linux
	mcpu := float64(cpu1-cpu0) / ticksPerSecond / elapsed.Seconds() * 1000

	fmt.Printf("| metric | value |\n|---|---|\n")
	fmt.Printf("| window | %s after %s warm-up, default intervals (check 10s, lease renew 10s, condition heartbeat 5m) |\n", elapsed.Round(time.Second), warmup)
	fmt.Printf("| RSS median (max) | %.1f MiB (%.1f MiB) |\n", mib(rss[len(rss)/2]), mib(rss[len(rss)-1]))
	fmt.Printf("| of which anonymous (heap, stacks) | %.1f MiB |\n", mib(anon[len(anon)/2]))
	fmt.Printf("| of which file-backed (binary pages) | %.1f MiB |\n", mib(file[len(file)/2]))
	fmt.Printf("| CPU average | %.2f mCPU |\n", mcpu)
	fmt.Printf("| context switches, all threads (a count: robust to load) | %.0f per minute |\n", float64(cs1-cs0)/minutes)
	printCounts := func(who string, a, b sched, ra, rb [2]float64, byMinute []sched) {
		fmt.Printf("| %sCPU from schedstat (ns resolution) | %.3f mCPU = %.2f ms CPU per minute |\n", who, float64(b.runNS-a.runNS)/elapsed.Seconds()/1e6, float64(b.runNS-a.runNS)/1e6/minutes)
		if m := minuteMCPU(byMinute); len(m) > 1 {
			med := (m[(len(m)-1)/2] + m[len(m)/2]) / 2
			fmt.Printf("| %sCPU per minute, schedstat: median (min–max) of %d | %.3f mCPU (%.3f–%.3f) |\n", who, len(m), med, m[0], m[len(m)-1])
		}
		fmt.Printf("| %stimes put on a CPU (wake-ups, all threads) | %.0f per minute; voluntary switches %.0f, involuntary %.0f per minute |\n", who,
			float64(b.runs-a.runs)/minutes, float64(b.voluntary-a.voluntary)/minutes, float64(b.involuntary-a.involuntary)/minutes)
		if ra[0] > 0 && rb[0] > 0 {
			fmt.Printf("| %sallocations (go_memstats_mallocs_total) | %.0f per minute; GC cycles %.2f per minute |\n", who, (rb[0]-ra[0])/minutes, (rb[1]-ra[1])/minutes)
		}
	}
	printCounts("", ps0, ps1, rt0, rt1, append(minutes0, ps1))
	if other != nil {
		printCounts("checks off: ", ops0, ops1, ort0, ort1, nil)
		omcpu := float64(ocpu1-ocpu0) / ticksPerSecond / elapsed.Seconds() * 1000
		fmt.Printf("| same build, AWS event checks off (`imds.disabled: true`), same window: RSS median (max) | %.1f MiB (%.1f MiB); anonymous %.1f MiB, file-backed %.1f MiB |\n",
			mib(orss[len(orss)/2]), mib(orss[len(orss)-1]), mib(oanon[len(oanon)/2]), mib(ofile[len(ofile)/2]))
		fmt.Printf("| same, CPU average | %.2f mCPU |\n", omcpu)
		fmt.Printf("| same, context switches | %.0f per minute |\n", float64(ocs1-ocs0)/minutes)
		fmt.Printf("| IMDS watcher's cost (difference) | RSS %+.1f MiB median, CPU %+.2f mCPU |\n", mib(rss[len(rss)/2]-orss[len(orss)/2]), mcpu-omcpu)
		fmt.Printf("| note | the API rows below count every agent's requests |\n")
	}
	if abAgent != nil {
		abmcpu := float64(abcpu1-abcpu0) / ticksPerSecond / elapsed.Seconds() * 1000
		fmt.Printf("| A/B: %s, same settings, same window: RSS median (max) | %.1f MiB (%.1f MiB) |\n", abBin, mib(abrss[len(abrss)/2]), mib(abrss[len(abrss)-1]))
		fmt.Printf("| A/B: CPU average | %.2f mCPU (this build %+.2f) |\n", abmcpu, mcpu-abmcpu)
		printCounts("A/B: ", abps0, abps1, abrt0, abrt1, append(abMinutes, abps1))
		if imdsOn {
			fmt.Printf("| A/B: IMDS | %.1f metadata reads and %.2f token requests per minute |\n", float64(abReads1-abReads0)/minutes, float64(abTokens1-abTokens0)/minutes)
		}
	}
	if floorProc != nil {
		printCounts("lease floor: ", floor0, floor1, [2]float64{}, [2]float64{}, append(floorMinutes, floor1))
		above := func(a, b sched) float64 {
			return float64((b.runNS-a.runNS)-(floor1.runNS-floor0.runNS)) / elapsed.Seconds() / 1e6
		}
		fmt.Printf("| agent above the lease floor (schedstat, same window) | %+.3f mCPU |\n", above(ps0, ps1))
		if abAgent != nil {
			fmt.Printf("| A/B: agent above the lease floor | %+.3f mCPU |\n", above(abps0, abps1))
		}
		fmt.Printf("| note | the API rows below count the lease floor's Lease updates too |\n")
	}
	fmt.Printf("| Lease renewals (agent's own metric) | %.2f per minute |\n", (renew1-renew0)/minutes)
	if imdsOn {
		fmt.Printf("| IMDS (emulated, %s instance) | %.1f metadata reads and %.2f token requests per minute |\n", lifecycle, float64(reads1-reads0)/minutes, float64(tokens1-tokens0)/minutes)
	} else {
		fmt.Printf("| IMDS | default endpoint, unreachable here (watcher backing off) |\n")
	}
	keys := make([]string, 0, len(after))
	for k := range after {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		rate := (after[k] - before[k]) / minutes
		baseRate := (base1[k] - base0[k]) / baseMinutes
		if rate > 0 {
			fmt.Printf("| API %s | %.2f per minute (%.2f total − %.2f apiserver baseline) |\n", k, max(rate-baseRate, 0), rate, baseRate)
		}
	}
	fmt.Printf("| machine | %s/%s, %d CPUs, %s |\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	fmt.Printf("| load average (1/5/15 min) at the start → at the end of the window | %s → %s |\n", load0, benchmain.LoadAvg())
	return nil
}

// requestCounts scrapes apiserver_request_total and sums it by verb, resource and subresource
// for the mutating verbs and reads against nodes and leases.
func requestCounts(ctx context.Context, cfg *rest.Config) (map[string]float64, error) {
	tc, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	httpc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
	resp, err := httpc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		labels := parseLabels(line[len("apiserver_request_total{"):strings.LastIndexByte(line, '}')])
		if labels["resource"] != "nodes" && labels["resource"] != "leases" && labels["resource"] != "events" {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		key := labels["verb"] + " " + labels["resource"]
		if s := labels["subresource"]; s != "" {
			key += "/" + s
		}
		out[key] += v
	}
	return out, sc.Err()
}

func parseLabels(s string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			m[k] = strings.Trim(v, `"`)
		}
	}
	return m
}

// memKB reads VmRSS, RssAnon and RssFile (kB) from /proc/<pid>/status. Anonymous memory is
// what the agent allocates; file-backed pages are its binary's text mapped in, which the kernel
// can drop and re-read under pressure.
func memKB(pid int) (map[string]int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "VmRSS:" || f[0] == "RssAnon:" || f[0] == "RssFile:") {
			v, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return nil, err
			}
			out[strings.TrimSuffix(f[0], ":")] = v
		}
	}
	if _, ok := out["VmRSS"]; !ok {
		return nil, fmt.Errorf("no VmRSS for pid %d", pid)
	}
	return out, nil
}

func mib(kb int64) float64 { return float64(kb) / 1024 }

// scrapeSum fetches a Prometheus text page and returns the value of the series whose line
// starts with series (name and labels exactly as exposed).
func scrapeSum(ctx context.Context, url, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, fmt.Errorf("%s: no series %s", url, series)
}

// nodeChecksHealthy reports which of the agent's node checks (memory, kubelet, CNI, kubelet
// flags) is not Healthy on its metrics page at addr.
func nodeChecksHealthy(ctx context.Context, addr string) error {
	var bad []string
	for _, c := range []collectors.CheckName{collectors.CheckMemory, collectors.CheckKubelet, collectors.CheckCNI, collectors.CheckKubeletConfig} {
		v, err := scrapeSum(ctx, "http://"+addr+"/metrics", fmt.Sprintf(`nodevigil_agent_check_status{check="%s",status="%s"}`, c, collectors.StatusHealthy))
		if err != nil || v != 1 {
			bad = append(bad, string(c))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("checks %s are not Healthy on the fixture host", strings.Join(bad, ", "))
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// switches is the voluntary and involuntary context switches of every thread of pid (0 when
// /proc cannot be read: the row then shows nonsense rather than failing the run).
func switches(pid int) int64 {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var n int64
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			if f := strings.Fields(line); len(f) == 2 && strings.HasSuffix(f[0], "ctxt_switches:") {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				n += v
			}
		}
	}
	return n
}

// sched is a process's scheduler counts, summed over its threads.
type sched struct {
	runNS       int64 // time on a CPU (/proc/PID/task/*/schedstat, first field)
	runs        int64 // times put on a CPU (third field)
	voluntary   int64
	involuntary int64
	at          time.Time // when it was read
}

// minuteMCPU returns the CPU between consecutive snapshots (taken about a minute apart) in
// mCPU, sorted.
func minuteMCPU(snaps []sched) []float64 {
	var m []float64
	for i := 1; i < len(snaps); i++ {
		m = append(m, float64(snaps[i].runNS-snaps[i-1].runNS)/snaps[i].at.Sub(snaps[i-1].at).Seconds()/1e6)
	}
	slices.Sort(m)
	return m
}

// readSched sums /proc/PID/task/*/schedstat and the context switches in .../status (zero
// when /proc cannot be read).
func readSched(pid int) sched {
	s := sched{at: time.Now()}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, t := range tasks {
		if data, err := os.ReadFile(t + "/schedstat"); err == nil {
			if f := strings.Fields(string(data)); len(f) == 3 {
				r, _ := strconv.ParseInt(f[0], 10, 64)
				n, _ := strconv.ParseInt(f[2], 10, 64)
				s.runNS += r
				s.runs += n
			}
		}
		data, err := os.ReadFile(t + "/status")
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line)
			if len(f) != 2 {
				continue
			}
			v, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "voluntary_ctxt_switches:":
				s.voluntary += v
			case "nonvoluntary_ctxt_switches:":
				s.involuntary += v
			}
		}
	}
	return s
}

// runtimeCounts scrapes an agent's allocation and GC cycle counters (zero when addr is empty
// or the scrape fails; the row is then left out).
func runtimeCounts(ctx context.Context, addr string) [2]float64 {
	if addr == "" {
		return [2]float64{}
	}
	url := "http://" + addr + "/metrics"
	m, err := scrapeSum(ctx, url, "go_memstats_mallocs_total")
	if err != nil {
		return [2]float64{}
	}
	gc, _ := scrapeSum(ctx, url, "go_gc_duration_seconds_count")
	return [2]float64{m, gc}
}

func cpuTicks(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime, nil
}

// writeHost writes a host root the size of a busy EKS node's where the agent reads it every
// check: full-length meminfo and vmstat (fakeproc, from a real machine), the node's and the
// pods' PSI, a CNI config and plugin, and a /proc with systemd, 150 kernel threads and 150
// user processes (fakeproc.AddNodeSized), and a kubelet (PID 3120, started late in boot)
// whose command line registers the agent's startup taint. A proc with only the files the
// checks name would hide what a scan of the processes costs.
func writeHost(root string) error {
	const psi = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=500\n"
	type file struct {
		data string
		mode os.FileMode
	}
	files := map[string]file{
		"proc/pressure/memory":                         {psi, 0o644},
		"sys/fs/cgroup/kubepods.slice/memory.pressure": {psi, 0o644},
		"proc/meminfo":                                 {fakeproc.Meminfo, 0o644},
		"proc/vmstat":                                  {fakeproc.VMStat, 0o644},
		"etc/cni/net.d/10-bench.conflist":              {`{"cniVersion":"1.0.0","name":"bench","plugins":[{"type":"bridge"}]}`, 0o644},
		"opt/cni/bin/bridge":                           {"#!/bin/sh\n", 0o755},
		"etc/kubernetes/kubelet/config.json":           {`{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","maxPods":29}`, 0o644},
	}
	for name, f := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			return err
		}
	}
	proc := filepath.Join(root, "proc")
	if err := fakeproc.Write(proc, 1, "systemd", "/usr/lib/systemd/systemd", "--switched-root", "--system", "--deserialize", "31"); err != nil {
		return err
	}
	if err := fakeproc.AddNodeSized(proc); err != nil {
		return err
	}
	return fakeproc.Write(proc, 3120, "kubelet", "/usr/bin/kubelet", "--config=/etc/kubernetes/kubelet/config.json",
		"--kubeconfig=/var/lib/kubelet/kubeconfig", "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
		"--node-ip=10.0.0.12", "--hostname-override=ip-10-0-0-12.ec2.internal",
		"--register-with-taints=readiness.k8s.io/nodevigil-agent-not-ready=:NoSchedule")
}
