// Command nodevigil-agent is nodevigil's per-node agent.
//
// Usage:
//
//	nodevigil-agent [run] [flags]     run the agent (the DaemonSet's command; the default)
//	nodevigil-agent check [flags]     run every check once, print the verdicts, exit
//	nodevigil-agent version           print the version
//
// `check` needs no cluster: it reads the host (through --host-root) and prints a table
// (CHECK STATUS REASON MESSAGE) or, with --output json, an array of
// {check,status,reason,message}. Exit codes:
//
//	0  no check is Unhealthy. Warning results (configuration advisories) never fail the
//	   command. Unknown results (the check could not observe, e.g. no systemd in a container
//	   or a kernel without PSI) are listed in a warning on stderr but do not fail the
//	   command, so it stays usable on hosts that lack one data source.
//	   With --strict, Unknown fails the command like Unhealthy.
//	1  at least one check is Unhealthy (or Unknown with --strict), or the agent failed.
//	2  usage or configuration error.
//
// The AWS event checks (spot-interruption, rebalance-recommendation, scheduled-events,
// asg-lifecycle) never fail the command: a pending event is a Warning (AWS is taking the
// instance away; the node is not unhealthy), and an unreachable metadata service is an
// Unknown that does not count even with --strict, so the exit code off EC2 follows the other
// checks.
//
// The version is set at build time: -ldflags "-X main.version=v1.2.3 -X main.commit=<sha>".
// `version` and `--version` print it with the commit and the Go version.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/nodevigil/nodevigil/agent"
	"github.com/nodevigil/nodevigil/agent/config"
	"github.com/nodevigil/nodevigil/agent/kubeclient"
	"github.com/nodevigil/nodevigil/agent/residency"
	"github.com/nodevigil/nodevigil/agent/timerslack"
	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/cni"
	"github.com/nodevigil/nodevigil/collectors/imds"
	"github.com/nodevigil/nodevigil/collectors/kubelet"
	"github.com/nodevigil/nodevigil/collectors/memory"
	"github.com/nodevigil/nodevigil/collectors/wakeup"
	buildinfo "github.com/nodevigil/nodevigil/version"
)

// The agent embeds no CA roots (the remediator does, for the EC2 API): it only talks to its
// cluster's API server, whose CA comes from the ServiceAccount volume or the kubeconfig, and
// to node-local endpoints. Mozilla's bundle (golang.org/x/crypto/x509roots/fallback) is
// parsed at start-up and cost 1.5 MiB of resident memory on every node for nothing.

// version and commit are overridden at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = ""
)

// versionLine is what `version` and `--version` print: version, commit and Go version.
func versionLine() string { return buildinfo.Line("nodevigil-agent", version, commit) }

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// timerSlackErr is why main could not give the agent its timer slack, for runAgent to log.
var timerSlackErr error

func main() {
	if cmd, _ := command(os.Args[1:]); cmd == "run" {
		// First, before any output: on success the binary starts again, in place, with the
		// slack (package timerslack), and this call does not return.
		timerSlackErr = timerslack.Ensure(timerslack.Slack)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	go func() {
		// After the first signal, restore the default handling so a second one kills at once.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, buildChecks)
	stop()
	os.Exit(code)
}

// maxProcs caps GOMAXPROCS while the agent runs. Its work is a few I/O-bound checks, a Lease
// renewal and a metrics scrape every 10 s (well under 1 mCPU); nothing in it runs in parallel
// for long. The Go runtime sizes itself to the node instead (to the CPU limit rounded up, at
// least 2, since Go 1.25; to the core count without a limit), and every P costs: per-P
// allocation caches, GC workers, threads, and a spinning M looking for work whenever a
// goroutine wakes. Measured with integration/bench/agentsteady (docs/benchmarks.md): one P
// instead of two saved 0.5 MiB RSS and a quarter of the idle CPU; 16 Ps had cost 1.2 MiB more
// than 2.
const maxProcs = 1

// procs returns the GOMAXPROCS to set given the current value and whether the GOMAXPROCS
// environment variable is set (an operator's explicit choice wins), or 0 to leave it.
func procs(current int, envSet bool) int {
	if envSet || current <= maxProcs {
		return 0
	}
	return maxProcs
}

// gcPercent is the agent's GOGC unless the GOGC environment variable is set (an operator's
// explicit choice wins). The agent's live heap is about 2 MiB, below the runtime's 4 MiB
// minimum heap goal at GOGC 100, so the heap grew to 4 MiB of mostly garbage between two
// collections (one every few minutes) and the scavenger kept it resident: that was most of the
// anonymous RSS the IMDS poll's garbage added (docs/benchmarks.md, "Agent steady state"). At
// 50 the goal is 1.5 × the live heap; the collections this adds cost a few hundred
// microseconds each, once a minute or so.
const gcPercent = 50

// gogc returns the GC percent to set given whether the GOGC environment variable is set, or
// -1 to leave the runtime's.
func gogc(envSet bool) int {
	if envSet {
		return -1
	}
	return gcPercent
}

// releaseStartup gives back what only start-up needed, once the first conditions are on the
// Node: the mappings of the binary's read-only pages and the start-up heap (package
// residency; docs/benchmarks.md, "Where the agent's memory goes"). A failure costs memory,
// not function, so it is logged and the agent goes on.
func releaseStartup(log *slog.Logger) {
	st, err := residency.Release()
	if err != nil {
		log.Warn("release start-up memory failed", "err", err)
		return
	}
	log.Debug("start-up memory released", "mappings", st.Mappings, "binary_resident_before", st.Before, "binary_resident_after", st.After)
}

// checkBuilder builds the checks from the configuration and returns a function releasing
// them (the kubelet check holds a D-Bus connection). Tests replace it.
type checkBuilder func(cfg *config.Config, log *slog.Logger) ([]agent.Checker, func(), error)

const usage = `nodevigil-agent keeps a Kubernetes node honest: it checks memory pressure, kubelet
health and CNI readiness, reports Node conditions, removes owned startup taints once the node
is ready and renews a heartbeat Lease.

Usage:
  nodevigil-agent [run] [flags]   run the agent (default)
  nodevigil-agent check [flags]   run every check once without a cluster and print the result
  nodevigil-agent version         print the version

Run "nodevigil-agent run -h" or "nodevigil-agent check -h" for the flags.
`

// command splits the command line into the subcommand ("run" when none is named) and its
// flags.
func command(args []string) (string, []string) {
	cmd := "run"
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		cmd, args = "version", args[1:]
	}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	return cmd, args
}

// run dispatches the subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, build checkBuilder) int {
	cmd, args := command(args)
	switch cmd {
	case "run":
		return runAgent(ctx, args, stderr, build)
	case "check":
		return runCheck(ctx, args, stdout, stderr, build)
	case "version":
		fmt.Fprintln(stdout, versionLine())
		return exitOK
	case "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "error: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
}

// loadConfig parses flags and file; it reports errors itself and returns the exit code to
// use when cfg is nil.
func loadConfig(mode config.Mode, args []string, stderr io.Writer) (*config.Config, int) {
	cfg, err := config.Load(mode, config.Source{Args: args, Output: stderr})
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil, exitOK
	case err != nil:
		fmt.Fprintf(stderr, "error: %v\n", strings.ReplaceAll(err.Error(), "\n", "\nerror: "))
		return nil, exitUsage
	}
	if fi, err := os.Stat(cfg.HostRoot); err != nil || !fi.IsDir() {
		fmt.Fprintf(stderr, "error: hostRoot %q is not a directory; set --host-root to where the host filesystem is mounted\n", cfg.HostRoot)
		return nil, exitUsage
	}
	return cfg, exitOK
}

// buildChecks wires the concrete collectors, in the order `check` prints them.
func buildChecks(cfg *config.Config, log *slog.Logger) ([]agent.Checker, func(), error) {
	m := cfg.Memory
	mem, err := memory.New(memory.Config{
		HostRoot: cfg.HostRoot, Logger: log, OneShot: cfg.OneShot, KubeletUnit: cfg.KubeletUnit,
		PSIFullEnterPercent: m.PSIFullEnterPercent, PSIFullExitPercent: m.PSIFullExitPercent,
		AvailableLowPercent: m.AvailableLowPercent, AvailableLowBytes: m.AvailableLowMiB << 20,
		AvailableEnterPercent: m.AvailableCriticalPercent, AvailableEnterBytes: m.AvailableCriticalMiB << 20,
		AvailableExitPercent: m.AvailableClearPercent, AvailableExitBytes: m.AvailableClearMiB << 20,
		EnterAfter: m.EnterAfter.Duration, ExitAfter: m.ExitAfter.Duration,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("memory check (config file section memory): %w", err)
	}
	threshold := cfg.KubeletHealthzFailureThreshold
	if cfg.OneShot {
		threshold = 1 // one reading: a refused or failing /healthz is the answer
	}
	kub, err := kubelet.New(kubelet.Config{HostRoot: cfg.HostRoot, Unit: cfg.KubeletUnit, HealthzURL: cfg.KubeletHealthzURL,
		HealthzFailureThreshold: threshold, Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("kubelet check: %w", err)
	}
	net, err := cni.New(cni.Config{HostRoot: cfg.HostRoot, ConfDir: cfg.CNIConfDir, BinDir: cfg.CNIBinDir, HealthURL: cfg.CNIHealthURL, Preset: cfg.CNIPreset})
	if err != nil {
		_ = kub.Close()
		return nil, nil, fmt.Errorf("cni check: %w", err)
	}
	kcfg, err := kubelet.NewConfigCheck(kubelet.ConfigCheckConfig{HostRoot: cfg.HostRoot, Unit: cfg.KubeletUnit,
		ExpectedTaints: cfg.OwnedTaints, MissingIsUnhealthy: cfg.MissingOwnedTaintIsUnhealthy})
	if err != nil {
		_ = kub.Close()
		return nil, nil, fmt.Errorf("kubelet-config check: %w", err)
	}
	closeAll := func() {
		if err := kub.Close(); err != nil {
			log.Debug("close kubelet check", "err", err)
		}
	}
	checks := []agent.Checker{mem, kub, net, kcfg}
	if !cfg.IMDS.Disabled {
		wcfg := cfg.IMDS.WatcherConfig()
		wcfg.OneShot, wcfg.Logger = cfg.OneShot, log
		w, err := imds.New(wcfg)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("AWS event checks (config file section imds): %w", err)
		}
		for _, c := range w.Checks() {
			checks = append(checks, c)
		}
	}
	return checks, closeAll, nil
}

// imdsWatcher returns the AWS event watcher behind checks, or nil when they hold none.
func imdsWatcher(checks []agent.Checker) *imds.Watcher {
	for _, c := range checks {
		if ic, ok := c.(imds.Check); ok {
			return ic.Watcher()
		}
	}
	return nil
}

// repairer adapts the kubelet collector's Repairer to the agent's interface.
type repairer struct{ r *kubelet.Repairer }

func (a repairer) Repair(ctx context.Context, res collectors.Result) (agent.RepairOutcome, error) {
	at, err := a.r.Repair(ctx, res)
	return agent.RepairOutcome{Attempted: at.Attempted, Reason: at.Reason, Attempt: at.Attempt, NextAllowed: at.NextAllowed}, err
}

func runAgent(ctx context.Context, args []string, stderr io.Writer, build checkBuilder) int {
	cfg, code := loadConfig(config.ModeRun, args, stderr)
	if cfg == nil {
		return code
	}
	log := cfg.NewLogger(stderr)
	slog.SetDefault(log)
	if timerSlackErr != nil {
		log.Warn("timer slack not applied; the agent wakes more often when idle", "err", timerSlackErr)
	}
	if n := procs(runtime.GOMAXPROCS(0), os.Getenv("GOMAXPROCS") != ""); n > 0 {
		prev := runtime.GOMAXPROCS(n)
		log.Debug("gomaxprocs capped", "from", prev, "to", n)
	}
	if p := gogc(os.Getenv("GOGC") != ""); p >= 0 {
		debug.SetGCPercent(p)
	}
	klog.SetSlogLogger(log) // client-go's own messages (API warnings, auth plugins) as slog

	rc, err := cfg.RESTConfig(agent.Component + "/" + version)
	if err != nil {
		log.Error("build api client config failed", "err", err)
		return exitUsage
	}
	client, err := kubeclient.New(rc)
	if err != nil {
		log.Error("build api client failed", "err", err)
		return exitUsage
	}
	checks, closeChecks, err := build(cfg, log)
	if err != nil {
		log.Error("build checks failed", "err", err)
		return exitUsage
	}
	defer closeChecks()

	var rep agent.Repairer
	if cfg.KubeletRepair {
		r, err := kubelet.NewRepairer(kubelet.RepairConfig{HostRoot: cfg.HostRoot, Unit: cfg.KubeletUnit, Logger: log})
		if err != nil {
			log.Error("build kubelet repairer failed", "err", err)
			return exitUsage
		}
		defer func() { _ = r.Close() }()
		rep = repairer{r}
	}

	// One schedule for every periodic job (check cycle, Lease renewal, AWS event polls), so
	// they share wake-ups (package wakeup); its random origin spreads a cluster's agents.
	grid := wakeup.NewGrid(time.Now(), max(cfg.CheckInterval.Duration, cfg.LeaseRenewInterval.Duration, agent.DefaultCheckInterval))
	var wake <-chan struct{}
	var extra []prometheus.Collector
	if w := imdsWatcher(checks); w != nil {
		w.SetGrid(grid)
		wake, extra = w.Changed(), []prometheus.Collector{w}
		wctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); w.Run(wctx) }()
		defer func() { stop(); <-done }()
	}

	window := cfg.TaintStabilityWindow.Duration
	if window == 0 {
		window = -1 // explicit zero: release on the first healthy cycle (agent treats 0 as default)
	}
	a, err := agent.New(agent.Config{
		Nodes:                client.Nodes(),
		Leases:               client.Leases(cfg.Namespace),
		Events:               client.Events(metav1.NamespaceDefault),
		NodeName:             cfg.NodeName,
		Namespace:            cfg.Namespace,
		PodName:              cfg.PodName,
		Version:              version,
		Checks:               checks,
		CheckInterval:        cfg.CheckInterval.Duration,
		CheckTimeout:         cfg.CheckTimeout.Duration,
		ConditionHeartbeat:   cfg.ConditionHeartbeat.Duration,
		OwnedTaints:          cfg.OwnedTaints,
		GatingChecks:         cfg.GatingChecks,
		TaintStabilityWindow: window,
		ReaddTaintOnFailure:  cfg.ReaddTaintOnFailure,
		LeaseDuration:        cfg.LeaseDuration.Duration,
		LeaseRenewInterval:   cfg.LeaseRenewInterval.Duration,
		LeaseRenewTimeout:    cfg.LeaseRenewTimeout.Duration,
		Repairer:             rep,
		Wake:                 wake,
		Collectors:           extra,
		Started:              func() { releaseStartup(log) },
		Grid:                 grid,
		ListenAddress:        cfg.ListenAddress,
		Logger:               log,
	})
	if err != nil {
		log.Error("build agent failed", "err", err)
		return exitUsage
	}
	log.Info("starting", "node", cfg.NodeName, "version", version, "config", cfg.ConfigFile)
	if err := a.Run(ctx); err != nil {
		log.Error("agent failed", "err", err)
		return exitFailed
	}
	return exitOK
}

// checkOutput is one line of `check --output json`.
type checkOutput struct {
	Check   string             `json:"check"`
	Status  string             `json:"status"`
	Reason  string             `json:"reason"`
	Message string             `json:"message"`
	Inputs  []collectors.Input `json:"inputs,omitempty"`
}

// checkRunTimeout bounds each check in `check` mode (collectors bound themselves; this is the
// backstop).
const checkRunTimeout = 10 * time.Second

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer, build checkBuilder) int {
	cfg, code := loadConfig(config.ModeCheck, args, stderr)
	if cfg == nil {
		return code
	}
	log := cfg.NewLogger(stderr)
	checks, closeChecks, err := build(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitUsage
	}
	defer closeChecks()

	results := agent.RunOnce(ctx, checks, checkRunTimeout, log)
	if err := printResults(stdout, cfg.Output, cfg.Explain, results); err != nil {
		fmt.Fprintf(stderr, "error: write output: %v\n", err)
		return exitFailed
	}
	return checkExitCode(stderr, cfg.Strict, results)
}

// checkExitCode maps the verdicts onto the documented exit code: 1 only for Unhealthy (or
// Unknown with strict). Warnings are advisories and never fail the command; Unknown results
// are named on stderr with what could not be observed.
func checkExitCode(stderr io.Writer, strict bool, results []collectors.Result) int {
	var unhealthy, unknown []string
	awsUnknown := false
	for _, r := range results {
		switch r.Status {
		case collectors.StatusHealthy, collectors.StatusWarning:
		case collectors.StatusUnhealthy:
			unhealthy = append(unhealthy, string(r.Check))
		default:
			if collectors.IsAWSEvent(r.Check) {
				// The metadata service is out of reach (off EC2, hop limit): AWS events are
				// not observed, which says nothing about this node's health.
				awsUnknown = true
				continue
			}
			unknown = append(unknown, string(r.Check))
		}
	}
	if awsUnknown {
		fmt.Fprintln(stderr, "warning: the instance metadata service could not be reached, so AWS events (spot notices, scheduled events) are not shown; not counted as a failure, even with --strict (see the AWS event checks' messages for the cause and fix)")
	}
	if len(unknown) > 0 {
		verdict := "not counted as failures (use --strict to fail on them)"
		if strict {
			verdict = "counted as failures (--strict)"
		}
		fmt.Fprintf(stderr, "warning: could not observe %s (see each message for what is missing and the mount or flag that provides it); %s\n",
			strings.Join(unknown, ", "), verdict)
	}
	if len(unhealthy) > 0 || (strict && len(unknown) > 0) {
		return exitFailed
	}
	return exitOK
}

// printResults writes the results as an aligned table or a JSON array; with explain, every
// input and threshold behind each verdict follows it.
func printResults(w io.Writer, format string, explain bool, results []collectors.Result) error {
	if format == config.OutputJSON {
		out := make([]checkOutput, len(results))
		for i, r := range results {
			out[i] = checkOutput{Check: string(r.Check), Status: string(r.Status), Reason: r.Reason, Message: r.Message}
			if explain {
				out[i].Inputs = r.Inputs
			}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false) // thresholds read "< 389Mi", not "\u003c 389Mi"
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tREASON\tMESSAGE")
	oneLine := strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Check, r.Status, r.Reason, oneLine.Replace(r.Message))
	}
	if err := tw.Flush(); err != nil || !explain {
		return err
	}
	for _, r := range results {
		fmt.Fprintf(w, "\n%s (%s/%s) inputs:\n", r.Check, r.Status, r.Reason)
		if len(r.Inputs) == 0 {
			fmt.Fprintln(w, "  (this check lists no separate inputs; its message carries the values it read)")
			continue
		}
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  INPUT\tVALUE\tTHRESHOLD\tSOURCE")
		for _, in := range r.Inputs {
			th := in.Threshold
			if th == "" {
				th = "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", in.Name, oneLine.Replace(in.Value), oneLine.Replace(th), in.Source)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
