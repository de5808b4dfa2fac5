package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"sort"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/remediation/config"
)

// Where the remediator and the kubelets keep what this command reads. They match the
// remediator's defaults (remediation.DefaultKubeletLeaseNamespace, remediation.LabelAgentNode);
// the plugin does not import the remediator's controller package, which would pull the EC2 SDK
// into a kubectl plugin.
const (
	kubeletLeaseNamespace = "kube-node-lease"
	agentLeaseLabel       = "nodevigil.io/node"
	configMapKey          = "remediator.yaml"
	listPageSize          = 500
)

// snapshot is everything the commands judge, read at one moment.
type snapshot struct {
	now time.Time
	// cfg is the remediator's configuration, or the built-in default when it could not be read
	// (cfgNote then says why).
	cfg       *config.Config
	cfgSource string
	cfgNote   string
	nodes     []corev1.Node
	kubelet   map[string]*coordinationv1.Lease
	agent     map[string]*coordinationv1.Lease
}

// gather reads the snapshot. Only failures to read Nodes are fatal: without Leases or the
// ConfigMap the commands still answer, with a note on stderr.
func gather(ctx context.Context, c kubernetes.Interface, opts options, notes io.Writer, selector string) (*snapshot, error) {
	s := &snapshot{kubelet: map[string]*coordinationv1.Lease{}, agent: map[string]*coordinationv1.Lease{}}
	nodes, err := listNodes(ctx, c, selector)
	if err != nil {
		return nil, explainAPIError(err, "list nodes")
	}
	s.cfg, s.cfgSource, s.cfgNote = loadConfig(ctx, c, opts)
	if s.cfgNote != "" {
		fmt.Fprintf(notes, "note: %s\n", s.cfgNote)
	}
	// Only the nodes the remediator watches: the caps and pauses it applies count no others.
	s.nodes = slices.DeleteFunc(nodes, func(n corev1.Node) bool { return !s.cfg.Scope.Matches(labels.Set(n.Labels)) })
	if out := len(nodes) - len(s.nodes); out > 0 {
		fmt.Fprintf(notes, "note: %d nodes outside the remediator's nodeSelector (%s) are not shown\n", out, s.cfg.NodeSelector)
	}
	kl, err := listLeases(ctx, c, kubeletLeaseNamespace, "")
	if err != nil {
		fmt.Fprintf(notes, "note: kubelet Leases unreadable, shown as missing: %s\n", oneLine(explainAPIError(err, "list leases in "+kubeletLeaseNamespace)))
	}
	for i := range kl {
		s.kubelet[kl[i].Name] = &kl[i]
	}
	al, err := listLeases(ctx, c, s.cfg.AgentNamespace, agentLeaseLabel)
	if err != nil {
		fmt.Fprintf(notes, "note: agent Leases unreadable, shown as missing: %s\n", oneLine(explainAPIError(err, "list leases in "+s.cfg.AgentNamespace)))
	}
	for i := range al {
		node := al[i].Labels[agentLeaseLabel]
		if node == "" {
			node = al[i].Name
		}
		s.agent[node] = &al[i]
	}
	s.now = time.Now()
	return s, nil
}

// loadConfig reads the remediator's configuration from its ConfigMap.
func loadConfig(ctx context.Context, c kubernetes.Interface, opts options) (*config.Config, string, string) {
	source := "configmap " + opts.namespace + "/" + opts.configMap
	cm, err := c.CoreV1().ConfigMaps(opts.namespace).Get(ctx, opts.configMap, metav1.GetOptions{})
	if err != nil {
		return config.Default(), "built-in defaults",
			fmt.Sprintf("using the remediator's built-in defaults: cannot read %s (%s); pass -n/--config-map where nodevigil is installed",
				source, oneLine(explainAPIError(err, "get "+source)))
	}
	data, ok := cm.Data[configMapKey]
	if !ok {
		return config.Default(), "built-in defaults",
			fmt.Sprintf("using the remediator's built-in defaults: %s has no key %s", source, configMapKey)
	}
	cfg, err := config.Parse([]byte(data))
	if err != nil {
		return config.Default(), "built-in defaults",
			fmt.Sprintf("using the remediator's built-in defaults: %s key %s is invalid: %s", source, configMapKey, oneLine(err))
	}
	return cfg, source, ""
}

func listNodes(ctx context.Context, c kubernetes.Interface, selector string) ([]corev1.Node, error) {
	var out []corev1.Node
	opts := metav1.ListOptions{LabelSelector: selector, Limit: listPageSize}
	for {
		l, err := c.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, l.Items...)
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func listLeases(ctx context.Context, c kubernetes.Interface, ns, selector string) ([]coordinationv1.Lease, error) {
	var out []coordinationv1.Lease
	opts := metav1.ListOptions{LabelSelector: selector, Limit: listPageSize}
	for {
		l, err := c.CoordinationV1().Leases(ns).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, l.Items...)
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	return out, nil
}

// getNode reads one node with the API's errors turned into plain sentences.
func getNode(ctx context.Context, c kubernetes.Interface, name string) (*corev1.Node, error) {
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, explainAPIError(err, "get node "+name)
	}
	return n, nil
}

// nodeEvents returns the Events about node, oldest first. Node Events live in the namespace
// their reporter chose (default for the remediator and kubelet), so all namespaces are read.
func nodeEvents(ctx context.Context, c kubernetes.Interface, node string) ([]corev1.Event, error) {
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node}.AsSelector().String()
	l, err := c.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, explainAPIError(err, "list events")
	}
	evs := l.Items
	sort.SliceStable(evs, func(i, j int) bool { return eventTime(evs[i]).Before(eventTime(evs[j])) })
	return evs, nil
}

// eventTime is when an Event last happened, whichever API wrote it.
func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// explainAPIError turns the errors an operator meets — no such node, no permission, no
// cluster — into one sentence that says what to do.
func explainAPIError(err error, what string) error {
	var uerr *url.Error
	var nerr net.Error
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: not found", what)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: forbidden: your credentials lack this permission (see docs/kubectl-plugin.md for the RBAC it needs): %w", what, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: unauthorized: the kubeconfig's credentials were refused: %w", what, err)
	case errors.As(err, &uerr) || errors.As(err, &nerr) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: cannot reach the cluster (check --context and that the API server is up): %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
