package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// runHold sets (hold) or clears (release) the do-not-remediate annotation. The remediator reads
// any value but "false" as a hold, so the value carries the operator's reason. A hold stops every
// step short of a termination already requested; a release only lifts the hold — the remediator
// then judges the node afresh.
func runHold(ctx context.Context, c kubernetes.Interface, opts options, name string, hold bool, stdout io.Writer) error {
	if _, err := getNode(ctx, c, name); err != nil {
		return err
	}
	var value any // JSON null removes the annotation
	if hold {
		value = "true"
		if opts.reason != "" {
			value = opts.reason
		}
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{decide.AnnotationDoNotRemediate: value}},
	})
	if err != nil {
		return fmt.Errorf("build patch: %w", err)
	}
	n, err := c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-nodevigil"})
	if err != nil {
		return explainAPIError(err, "patch node "+name)
	}
	switch phase := decide.PhaseOf(n); {
	case hold && phase.PastPointOfNoReturn():
		fmt.Fprintf(stdout, "node/%s held, but its termination was already requested (state %s): a hold cannot stop it\n", name, phase)
	case hold:
		fmt.Fprintf(stdout, "node/%s held: nodevigil will not remediate it until 'kubectl nodevigil release %s'\n", name, name)
	default:
		fmt.Fprintf(stdout, "node/%s released: nodevigil judges it again by its policy\n", name)
	}
	return nil
}
