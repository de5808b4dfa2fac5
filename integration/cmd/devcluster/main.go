// Command devcluster runs nodevigil on this machine for development: `paths` finds or builds
// the control-plane binaries and prints where they are; `up` starts a local control plane and
// prints how to talk to it, until interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodevigil/nodevigil/integration/controlplane"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "paths":
		err = paths(ctx)
	case "up":
		err = up(ctx, os.Args[2:])
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		slog.Error("devcluster failed", "err", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: devcluster paths | up [--dir DIR]")
}

func paths(ctx context.Context) error {
	bins, err := controlplane.FindOrBuild(ctx, controlplane.BuildConfig{})
	if err != nil {
		return err
	}
	fmt.Printf("etcd                    %s\nkube-apiserver          %s\nkube-controller-manager %s\n",
		bins.Etcd, bins.APIServer, bins.ControllerManager)
	return nil
}

func up(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	dir := fs.String("dir", "", "working directory for the control plane (default: a new temporary directory, removed on exit)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cp, err := controlplane.Start(ctx, controlplane.Config{Dir: *dir})
	if err != nil {
		return err
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			slog.Error("stop control plane", "err", err)
		}
	}()
	fmt.Printf("\ncontrol plane is up at %s\nkubeconfig: %s\ntry:        kubectl --kubeconfig %s get nodes\nCtrl-C stops everything.\n",
		cp.URL(), cp.KubeconfigPath(), cp.KubeconfigPath())
	<-ctx.Done()
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil
	}
	return ctx.Err()
}
