// Command timeline draws one node's remediation from a running cluster's Events as an SVG
// picture (integration/timeline): in `make run`, after a fault has been handled,
//
//	go run ./integration/cmd/timeline --kubeconfig K --node general-a-1 --out timeline.svg
//
// `make timeline` regenerates docs/remediation-timeline.svg from a fresh scenario run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	points, err := timeline.Collect(ctx, client, *node)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, timeline.SVG("Remediation of "+*node, *node, points), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	fmt.Printf("%d events drawn into %s\n", len(points), *out)
	return nil
}
