// Package kubeclient is the agent binary's API client: exactly the calls nodevigil-agent makes
// (read and patch its Node, read and write its Lease, write Events) over client-go's rest
// package.
//
// It exists for memory. client-go's clientset links about 60 typed clients and its scheme
// registers every built-in API group when the binary starts, which on a per-node DaemonSet
// costs several MiB of resident memory on every node for code the agent never calls. This
// client registers only core/v1 and coordination.k8s.io/v1. On the wire it behaves like the
// typed clients it replaces: same paths, verbs, content types (protobuf when the rest.Config
// asks for it), query parameters, user agent, and one rate limiter shared by both groups.
//
// Nodes satisfies the agent's nodepatch.NodeClient, Leases satisfies
// heartbeat.LeaseClient, and Events satisfies events.Sink.
package kubeclient

import (
	"context"
	"errors"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Client talks to the API server for the agent. It is safe for concurrent use.
type Client struct {
	core   rest.Interface
	coord  rest.Interface
	params runtime.ParameterCodec
}

// NewScheme returns a scheme holding only the types the agent sends and receives: core/v1
// (Node, Event, Status, the option types) and coordination.k8s.io/v1 (Lease).
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	// The unversioned option types (GetOptions, PatchOptions, ...), as client-go's own scheme
	// registers them, so VersionedParams can encode them for either group.
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, coordinationv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("kubeclient: build scheme: %w", err)
		}
	}
	return s, nil
}

// New builds a Client from rc. It does no I/O. The rate limit (rc.QPS and rc.Burst, or
// rc.RateLimiter) is shared by all calls, as it is in client-go's clientset.
func New(rc *rest.Config) (*Client, error) {
	if rc == nil {
		return nil, errors.New("kubeclient: rest.Config is required")
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	cfg := *rc
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		if cfg.Burst <= 0 {
			return nil, fmt.Errorf("kubeclient: burst must be greater than 0 when QPS (%v) is set", cfg.QPS)
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	cfg.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(scheme, serializer.NewCodecFactory(scheme)).WithoutConversion()
	httpClient, err := rest.HTTPClientFor(&cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeclient: build HTTP client: %w", err)
	}

	coreCfg := cfg
	coreCfg.APIPath = "/api"
	coreCfg.GroupVersion = &corev1.SchemeGroupVersion
	core, err := rest.RESTClientForConfigAndClient(&coreCfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("kubeclient: build core/v1 client: %w", err)
	}
	coordCfg := cfg
	coordCfg.APIPath = "/apis"
	coordCfg.GroupVersion = &coordinationv1.SchemeGroupVersion
	coord, err := rest.RESTClientForConfigAndClient(&coordCfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("kubeclient: build coordination/v1 client: %w", err)
	}
	return &Client{core: core, coord: coord, params: runtime.NewParameterCodec(scheme)}, nil
}

// Nodes returns the client for Nodes (cluster-scoped).
func (c *Client) Nodes() *Nodes { return &Nodes{c: c} }

// Leases returns the client for Leases in namespace.
func (c *Client) Leases(namespace string) *Leases { return &Leases{c: c, namespace: namespace} }

// Events returns the client for Events in namespace. It satisfies events.Sink (for the
// default namespace, where Events about the Node live).
func (c *Client) Events(namespace string) *Events { return &Events{c: c, namespace: namespace} }

// Nodes reads and patches Nodes.
type Nodes struct{ c *Client }

// Get reads the Node name.
func (n *Nodes) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error) {
	out := &corev1.Node{}
	err := n.c.core.Get().UseProtobufAsDefault().
		Resource("nodes").Name(name).
		VersionedParams(&opts, n.c.params).
		Do(ctx).Into(out)
	return out, err
}

// Patch patches the Node name, or one of its subresources (e.g. "status"), with data of
// patch type pt, and returns the Node the server stored.
func (n *Nodes) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error) {
	out := &corev1.Node{}
	err := n.c.core.Patch(pt).UseProtobufAsDefault().
		Resource("nodes").Name(name).SubResource(subresources...).
		VersionedParams(&opts, n.c.params).
		Body(data).
		Do(ctx).Into(out)
	return out, err
}

// Leases reads and writes Leases in one namespace.
type Leases struct {
	c         *Client
	namespace string
}

// Get reads the Lease name.
func (l *Leases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := l.c.coord.Get().UseProtobufAsDefault().
		Namespace(l.namespace).Resource("leases").Name(name).
		VersionedParams(&opts, l.c.params).
		Do(ctx).Into(out)
	return out, err
}

// Create creates lease and returns what the server stored.
func (l *Leases) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := l.c.coord.Post().UseProtobufAsDefault().
		Namespace(l.namespace).Resource("leases").
		VersionedParams(&opts, l.c.params).
		Body(lease).
		Do(ctx).Into(out)
	return out, err
}

// Update replaces lease (guarded by its resourceVersion) and returns what the server stored.
func (l *Leases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := l.c.coord.Put().UseProtobufAsDefault().
		Namespace(l.namespace).Resource("leases").Name(lease.Name).
		VersionedParams(&opts, l.c.params).
		Body(lease).
		Do(ctx).Into(out)
	return out, err
}

// Events writes core/v1 Events in one namespace.
type Events struct {
	c         *Client
	namespace string
}

// Create creates event and returns what the server stored.
func (e *Events) Create(ctx context.Context, event *corev1.Event, opts metav1.CreateOptions) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := e.c.core.Post().UseProtobufAsDefault().
		Namespace(e.namespace).Resource("events").
		VersionedParams(&opts, e.c.params).
		Body(event).
		Do(ctx).Into(out)
	return out, err
}

// Patch patches the Event name with data of patch type pt; the event recorder uses it to
// bump the count of a repeated Event.
func (e *Events) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := e.c.core.Patch(pt).UseProtobufAsDefault().
		Namespace(e.namespace).Resource("events").Name(name).SubResource(subresources...).
		VersionedParams(&opts, e.c.params).
		Body(data).
		Do(ctx).Into(out)
	return out, err
}
