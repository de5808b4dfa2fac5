package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// RunTests is the body of a test package's TestMain: it starts one control plane for the
// package, runs the tests, stops the control plane and returns the exit code for os.Exit.
// A test that panics never returns here; the children die with the test binary anyway (see
// process), and an interrupt (Ctrl-C, CI timeout) tears down before exiting.
func RunTests(m *testing.M, cfg Config, cp **ControlPlane) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	started, err := Start(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: start: %v\n", err)
		return 1
	}
	*cp = started
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		if _, ok := <-sigs; ok {
			_ = started.Stop()
			os.Exit(1)
		}
	}()
	code := m.Run()
	signal.Stop(sigs)
	close(sigs)
	if err := started.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: stop: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
