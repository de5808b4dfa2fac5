// Package benchmain is what the benchmark commands that run nodevigil binaries on a real
// control plane (integration/bench/remediatorscale, integration/bench/interruptlatency) do the
// same way: the exit codes of main, and the start of a run — the binaries built without the race
// detector into a temporary folder, and a control plane without kube-controller-manager (nothing
// they measure needs it, and it would compete for the cores) — and the load average that every
// benchmark command, agentsteady's too, prints beside its figures.
package benchmain

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

// Main runs a benchmark command named name after its flags were parsed: invalid options
// (validate) exit 2, a failed run exits 1, each with the error on stderr prefixed with name;
// run's context ends on SIGINT or SIGTERM.
func Main(name string, validate func() error, run func(ctx context.Context) error) {
	if err := validate(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Setup is the start of a run: a temporary folder (removed by Close), the packages pkgs built
// into it (Bins, in pkgs' order) and a control plane (stopped by Close).
type Setup struct {
	Dir  string
	Bins []string
	CP   *controlplane.ControlPlane
	name string
}

// Start builds pkgs into a new temporary folder and starts a control plane without
// kube-controller-manager; logf reports progress.
func Start(ctx context.Context, name string, logf func(format string, args ...any), pkgs ...string) (_ *Setup, err error) {
	dir, err := os.MkdirTemp("", "nodevigil-"+name+"-")
	if err != nil {
		return nil, err
	}
	s := &Setup{Dir: dir, name: name}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	for _, pkg := range pkgs {
		logf("building %s (no race detector)", pkg)
		bin, err := testbin.Build(ctx, pkg, dir, false)
		if err != nil {
			return nil, err
		}
		s.Bins = append(s.Bins, bin)
	}
	if s.CP, err = controlplane.Start(ctx, controlplane.Config{DisableControllerManager: true}); err != nil {
		return nil, err
	}
	return s, nil
}

// Close stops the control plane and removes the folder.
func (s *Setup) Close() {
	if s.CP != nil {
		if err := s.CP.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: stop control plane: %v\n", s.name, err)
		}
	}
	_ = os.RemoveAll(s.Dir)
}

// LoadAvg returns the machine's load averages over 1, 5 and 15 minutes, as uptime prints them,
// or "unknown": the figures a benchmark prints mean little on a shared machine without them.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}
