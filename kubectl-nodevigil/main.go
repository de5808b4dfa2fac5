// Command kubectl-nodevigil is the kubectl plugin that answers the two questions an operator asks
// before trusting a remediator: what state is every node in, and why did (or didn't) nodevigil
// touch this one. On PATH (go install github.com/nodevigil/nodevigil/kubectl-nodevigil@latest,
// or krew with kubectl-nodevigil/krew.yaml) it runs as
//
//	kubectl nodevigil status [--watch] [-o wide|json|yaml] [-l selector]
//	kubectl nodevigil explain NODE
//	kubectl nodevigil hold NODE [--reason TEXT]
//	kubectl nodevigil release NODE
//
// It reads only what is in the cluster — Nodes, the kubelet and agent Leases, the remediator's
// ConfigMap and Events — and judges each node with the remediator's own decision function
// (remediation/decide), so it never disagrees with the remediator about the rules. It cannot
// know when the remediator last saw each Lease change, so its verdicts use the Leases'
// renewTime instead and say so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Exit codes. A missing node, an unreachable cluster or a refused request is exitError with
// one line on stderr; a bad command line is exitUsage.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

const usage = `kubectl nodevigil — what nodevigil sees, decides and does, node by node.

Usage:
  kubectl nodevigil status  [-o wide|json|yaml] [-l SELECTOR] [--watch [--interval 2s]]
  kubectl nodevigil explain NODE
  kubectl nodevigil hold    NODE [--reason TEXT]   # set nodevigil.io/do-not-remediate
  kubectl nodevigil release NODE                   # clear it

Global flags (before or after the command):
  --kubeconfig PATH      kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)
  --context NAME         kubeconfig context
  -n, --namespace NS     namespace nodevigil is installed in (default nodevigil-system)
  --config-map NAME      the remediator's ConfigMap in that namespace (default nodevigil-remediator)
  --request-timeout D    bound on each API request (default 15s)

status: one row per node — pool, zone, agent and kubelet Lease age, Ready, the agent's
conditions, startup taints, remediation state and reason — then one row per pool with its
caps in use and any storm pause. -o json prints one JSON object per node, one per line;
-o yaml one YAML document per node. Colour is used only on a terminal (NO_COLOR disables it).

explain: the story of one node in sentences: its heartbeats, conditions and taints, what the
remediator recorded and did (from its annotations and Events), the verdict its rules give now,
when the toleration ends, and what holds it back (cap, pause, hold, grace, Blocked).

Verdicts here are estimates: the remediator judges a Lease by when it saw the Lease change;
this command sees only the Lease's renewTime (written by the node's clock).

Exit status: 0 success, 1 error (one line on stderr), 2 bad command line.
`

// options are the flags every command shares.
type options struct {
	kubeconfig     string
	context        string
	namespace      string
	configMap      string
	requestTimeout time.Duration
	output         string
	selector       string
	watch          bool
	interval       time.Duration
	reason         string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, isTerminal(os.Stdout))
	stop()
	os.Exit(code)
}

func isTerminal(f *os.File) bool {
	return os.Getenv("NO_COLOR") == "" && term.IsTerminal(int(f.Fd()))
}

// run is the whole program: it returns the exit code and writes every error as one line.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, color bool) int {
	opts, cmd, pos, err := parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\nRun 'kubectl nodevigil --help' for usage.\n", err)
		return exitUsage
	}
	client, err := newClient(opts)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitError
	}
	switch cmd {
	case "status":
		err = runStatus(ctx, client, opts, stdout, stderr, color)
	case "explain":
		err = runExplain(ctx, client, opts, pos[0], stdout, stderr)
	case "hold":
		err = runHold(ctx, client, opts, pos[0], true, stdout)
	case "release":
		err = runHold(ctx, client, opts, pos[0], false, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "error: %s\n", oneLine(err))
		return exitError
	}
	return exitOK
}

// parse reads the command line. Flags may come before or after the command and its argument,
// as with kubectl.
func parse(args []string) (options, string, []string, error) {
	opts := options{}
	fs := flag.NewFlagSet("kubectl-nodevigil", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&opts.kubeconfig, "kubeconfig", "", "")
	fs.StringVar(&opts.context, "context", "", "")
	fs.StringVar(&opts.namespace, "namespace", "nodevigil-system", "")
	fs.StringVar(&opts.namespace, "n", "nodevigil-system", "")
	fs.StringVar(&opts.configMap, "config-map", "nodevigil-remediator", "")
	fs.DurationVar(&opts.requestTimeout, "request-timeout", 15*time.Second, "")
	fs.StringVar(&opts.output, "output", "", "")
	fs.StringVar(&opts.output, "o", "", "")
	fs.StringVar(&opts.selector, "selector", "", "")
	fs.StringVar(&opts.selector, "l", "", "")
	fs.BoolVar(&opts.watch, "watch", false, "")
	fs.BoolVar(&opts.watch, "w", false, "")
	fs.DurationVar(&opts.interval, "interval", 2*time.Second, "")
	fs.StringVar(&opts.reason, "reason", "", "")
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return opts, "", nil, err
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		rest = rest[1:]
	}
	if len(pos) == 0 {
		return opts, "", nil, errors.New("no command given (status, explain, hold or release)")
	}
	cmd, pos := pos[0], pos[1:]
	switch cmd {
	case "status":
		if len(pos) != 0 {
			return opts, "", nil, fmt.Errorf("status takes no arguments, got %q", strings.Join(pos, " "))
		}
		switch opts.output {
		case "", "wide", "json", "yaml":
		default:
			return opts, "", nil, fmt.Errorf("-o %q is not an output format: use wide, json or yaml", opts.output)
		}
		if opts.interval <= 0 {
			return opts, "", nil, fmt.Errorf("--interval %s must be positive", opts.interval)
		}
	case "explain", "hold", "release":
		if len(pos) != 1 {
			return opts, "", nil, fmt.Errorf("%s takes exactly one node name, got %d arguments", cmd, len(pos))
		}
	case "help":
		return opts, "", nil, flag.ErrHelp
	default:
		return opts, "", nil, fmt.Errorf("unknown command %q: use status, explain, hold or release", cmd)
	}
	if opts.reason != "" && cmd != "hold" {
		return opts, "", nil, errors.New("--reason applies to hold only")
	}
	if opts.requestTimeout <= 0 {
		return opts, "", nil, fmt.Errorf("--request-timeout %s must be positive", opts.requestTimeout)
	}
	return opts, cmd, pos, nil
}

// newClient builds a clientset from the kubeconfig the way kubectl resolves it.
func newClient(opts options) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = opts.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: opts.context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.Timeout = opts.requestTimeout
	cfg.UserAgent = "kubectl-nodevigil"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return client, nil
}

// oneLine folds an error onto one line: API errors can carry newlines.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
