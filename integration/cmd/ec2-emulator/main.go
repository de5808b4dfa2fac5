// Command ec2-emulator serves the EC2 Query API emulator of package ec2emu on a loopback
// address, so that a remediator run locally (make run, dry-run mode) has an EC2 endpoint to
// describe instances against without AWS credentials or network access.
//
// Point the remediator (or any aws-sdk-go-v2 client) at it with
//
//	AWS_ENDPOINT_URL_EC2=http://127.0.0.1:8790 AWS_REGION=us-east-1 \
//	AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local nodevigil-remediator ...
//
// Instances come from a YAML or JSON file (--instances, see ec2emu.LoadInstances) and/or
// repeated --instance flags of the form
//
//	i-0123456789abcdef0,zone=us-east-1a,state=running,tag:kubernetes.io/cluster/dev=owned
//
// Every call is logged with log/slog.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ec2-emulator:", err)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// instanceFlags collects repeated --instance values.
type instanceFlags []ec2emu.Instance

func (f *instanceFlags) String() string { return fmt.Sprint(len(*f), " instances") }

func (f *instanceFlags) Set(v string) error {
	in, err := parseInstance(v)
	if err != nil {
		return err
	}
	*f = append(*f, in)
	return nil
}

// parseInstance parses "ID[,zone=Z][,state=S][,tag:KEY=VALUE]...".
func parseInstance(spec string) (ec2emu.Instance, error) {
	parts := strings.Split(spec, ",")
	in := ec2emu.Instance{ID: strings.TrimSpace(parts[0])}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		switch {
		case !ok:
			return in, fmt.Errorf("instance %q: %q is not key=value (zone=, state= or tag:KEY=)", spec, p)
		case k == "zone":
			in.Zone = v
		case k == "state":
			in.State = v
		case strings.HasPrefix(k, "tag:") && len(k) > len("tag:"):
			if in.Tags == nil {
				in.Tags = map[string]string{}
			}
			in.Tags[strings.TrimPrefix(k, "tag:")] = v
		default:
			return in, fmt.Errorf("instance %q: unknown field %q (want zone, state or tag:KEY)", spec, k)
		}
	}
	if err := in.Validate(); err != nil {
		return in, err
	}
	return in, nil
}

// run parses args, serves until ctx is done, and shuts down gracefully.
func run(ctx context.Context, args []string, logOut io.Writer) error {
	fs := flag.NewFlagSet("ec2-emulator", flag.ContinueOnError)
	fs.SetOutput(logOut)
	listen := fs.String("listen", "127.0.0.1:8790", "address to serve on (loopback only is sensible: requests are not authenticated)")
	seedFile := fs.String("instances", "", "YAML or JSON file with the instances to serve ({instances: [{id, zone, state, tags}]})")
	var seeds instanceFlags
	fs.Var(&seeds, "instance", "an instance to serve: ID[,zone=Z][,state=S][,tag:KEY=VALUE]...; repeatable")
	shutdownDelay := fs.Duration("shutdown-delay", 10*time.Second, "how long a terminated instance stays shutting-down")
	urlFile := fs.String("url-file", "", "write the endpoint URL to this file once listening (useful with --listen 127.0.0.1:0)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))

	var instances []ec2emu.Instance
	if *seedFile != "" {
		f, err := os.Open(*seedFile)
		if err != nil {
			return fmt.Errorf("--instances: %w", err)
		}
		instances, err = ec2emu.LoadInstances(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("--instances %s: %w", *seedFile, err)
		}
	}
	instances = append(instances, seeds...)

	delay := *shutdownDelay
	if delay == 0 {
		delay = -1 // ec2emu reads zero as "default"; the flag's zero means "no delay"
	}
	srv := ec2emu.New(ec2emu.Config{Addr: *listen, ShutdownDelay: delay, Logger: log})
	for _, in := range instances {
		if err := srv.AddInstance(in); err != nil {
			return err
		}
	}
	if err := srv.Start(); err != nil {
		return err
	}
	log.Info("ec2 emulator listening", "url", srv.URL(), "instances", len(instances))
	if *urlFile != "" {
		if err := os.WriteFile(*urlFile, []byte(srv.URL()+"\n"), 0o644); err != nil {
			_ = srv.Close()
			return fmt.Errorf("--url-file: %w", err)
		}
	}

	<-ctx.Done()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	log.Info("ec2 emulator stopped", "calls", srv.Calls(""), "terminate_calls", len(srv.TerminateCalls()))
	return nil
}
