// Command imdspoll measures the CPU one AWS event watcher (collectors/imds) spends per poll of
// the spot group, in a process of its own, as the agent would spend it: the watcher polls an
// emulated spot instance's metadata service (integration/ec2emu, served by a second imdspoll
// process so its CPU is not counted) and the process's own user+system CPU (getrusage) is
// divided by the polls made. Run the same command built from two trees at the same time for
// an A/B in one window (docs/benchmarks.md, "Agent steady state"):
//
//	go run ./integration/bench/imdspoll -serve 127.0.0.1:39999 &
//	GOMAXPROCS=1 go run ./integration/bench/imdspoll -url http://127.0.0.1:39999 -interval 500ms -d 40s
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/nodevigil/nodevigil/collectors/imds"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

func main() {
	serve := flag.String("serve", "", "serve an emulated spot instance's metadata service on this address instead of polling")
	url := flag.String("url", "", "metadata service URL to poll")
	interval := flag.Duration("interval", 500*time.Millisecond, "spot interval (polls of the spot group)")
	d := flag.Duration("d", 40*time.Second, "measurement window, after a 3 s warm-up")
	flag.Parse()
	if err := run(*serve, *url, *interval, *d); err != nil {
		fmt.Fprintln(os.Stderr, "imdspoll:", err)
		os.Exit(1)
	}
}

func run(serve, url string, interval, d time.Duration) error {
	const id = "i-0123456789abcdef0"
	if serve != "" {
		emu := ec2emu.New(ec2emu.Config{})
		if err := emu.AddInstance(ec2emu.Instance{ID: id, Lifecycle: ec2emu.LifecycleSpot}); err != nil {
			return err
		}
		srv := &http.Server{Addr: serve, Handler: emu.IMDSHandler(id), ReadHeaderTimeout: 10 * time.Second}
		return srv.ListenAndServe()
	}
	if url == "" {
		return fmt.Errorf("-url or -serve is required")
	}
	w, err := imds.New(imds.Config{Endpoint: url, SpotInterval: interval, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(3 * time.Second) // the token, the life cycle and the first reads
	cpu0, err := cpuTime()
	if err != nil {
		return err
	}
	time.Sleep(d)
	cpu1, err := cpuTime()
	if err != nil {
		return err
	}
	cpu := cpu1 - cpu0
	polls := float64(d) / float64(interval)
	fmt.Printf("CPU %v over %v (%.0f polls of the spot group): %.3f mCPU, %.1f µs per poll\n",
		cpu.Round(time.Microsecond), d, polls, float64(cpu)/float64(d)*1000, float64(cpu.Nanoseconds())/1000/polls)
	return nil
}

// cpuTime is the process's user+system CPU so far.
func cpuTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
