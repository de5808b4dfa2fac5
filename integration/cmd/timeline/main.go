// Command timeline draws one node's remediation from a running cluster's Events, and the
// remediator's metrics sampled while it happens, as an SVG picture (integration/timeline). In
// `make run`, start it before injecting the fault, with the remediators' metrics URLs that
// `make run` prints, and stop it (Ctrl-C, or --sample-for) once the node is replaced:
//
//	go run ./integration/cmd/timeline --kubeconfig K --node general-a-1 \
//	    --metrics-url http://127.0.0.1:8081/metrics,http://127.0.0.1:8082/metrics --sample-for 3m
//
// Without --metrics-url it draws from the Events alone, after the fact (they live an hour).
// `make timeline` regenerates docs/remediation-timeline.svg from a fresh scenario run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodevigil/nodevigil/integration/timeline"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "timeline:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster (make run prints it)")
	node := flag.String("node", "", "the node whose remediation to draw (required)")
	out := flag.String("out", "timeline.svg", "where to write the SVG")
	metricsURLs := flag.String("metrics-url", "", "comma-separated /metrics URLs of the remediator replicas (make run prints them); sampled until --sample-for passes or Ctrl-C, then drawn under the Events")
	sampleFor := flag.Duration("sample-for", 5*time.Minute, "how long to sample --metrics-url before drawing (Ctrl-C draws at once)")
	flag.Parse()
	if *node == "" {
		return fmt.Errorf("--node is required: the node whose remediation to draw")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %q: %w", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	var metrics *timeline.Sampled
	if *metricsURLs != "" {
		if metrics, err = sample(strings.Split(*metricsURLs, ","), *sampleFor); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	points, err := timeline.Collect(ctx, client, *node)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, timeline.SVG("Remediation of "+*node, *node, points, metrics), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	fmt.Printf("%d events drawn into %s\n", len(points), *out)
	return nil
}

// sample scrapes the URLs until d passes or the user interrupts.
func sample(urls []string, d time.Duration) (*timeline.Sampled, error) {
	s, err := timeline.NewSampler(timeline.SamplerConfig{URLs: urls})
	if err != nil {
		return nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	fmt.Fprintf(os.Stderr, "sampling %s for %s (Ctrl-C to draw now)\n", strings.Join(urls, ", "), d)
	s.Run(ctx)
	m := s.Sampled()
	if len(m.Samples) == 0 {
		return nil, fmt.Errorf("no metrics sampled from %s (%d scrapes failed): is make run up?", strings.Join(urls, ", "), m.Failed)
	}
	return &m, nil
}
