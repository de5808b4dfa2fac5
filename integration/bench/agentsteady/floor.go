package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/nodevigil/nodevigil/agent/config"
	"github.com/nodevigil/nodevigil/agent/heartbeat"
	"github.com/nodevigil/nodevigil/agent/kubeclient"
	"github.com/nodevigil/nodevigil/agent/timerslack"
	"github.com/nodevigil/nodevigil/collectors/wakeup"
)

// roleLeaseFloor is the -role of the lease-floor child process (see runLeaseFloor).
const roleLeaseFloor = "lease-floor"

// runLeaseFloor is the lease floor: a process that does only what no agent can skip, renewing
// its heartbeat Lease every 10 s. It runs the agent's own heartbeat.Renewer over the agent's
// own API client and REST settings (protobuf, the default rate limits), on a wake-up grid,
// with the agent's GOMAXPROCS (1), GOGC (50) and timer slack, and nothing else: no checks, no metrics
// server, no AWS event watcher. Measured in the same window as the agent, it says how much of
// the agent's CPU any Go process heartbeating through client-go costs on this machine, so the
// agent's figure can be read against it rather than against a host whose minutes differ by
// up to 3×. It returns when SIGTERM or SIGINT arrives.
func runLeaseFloor(kubeconfig, node, namespace string) error {
	// The agent's timer slack too (on success this executes the binary again, in place).
	if err := timerslack.Ensure(timerslack.Slack); err != nil {
		return err
	}
	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(50)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	cfg := config.Default()
	cfg.Kubeconfig = kubeconfig
	rc, err := cfg.RESTConfig("nodevigil-lease-floor")
	if err != nil {
		return err
	}
	client, err := kubeclient.New(rc)
	if err != nil {
		return err
	}
	renewer, err := heartbeat.New(heartbeat.Config{
		Leases:         client.Leases(namespace),
		Nodes:          client.Nodes(),
		NodeName:       node,
		Namespace:      namespace,
		HolderIdentity: "lease-floor",
		LeaseDuration:  cfg.LeaseDuration.Duration,
		RenewInterval:  cfg.LeaseRenewInterval.Duration,
		Grid:           wakeup.NewGrid(time.Now(), cfg.LeaseRenewInterval.Duration),
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if err := renewer.Renew(ctx); err != nil {
		return fmt.Errorf("lease floor: first renewal: %w", err)
	}
	renewer.Run(ctx)
	return nil
}
