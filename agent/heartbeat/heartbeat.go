// Package heartbeat renews the agent's own Lease, the second liveness signal next to the
// kubelet's Lease in kube-node-lease.
//
// The remediator tells "the machine is gone" (both Leases stale) from "only the kubelet is
// dead" (agent Lease fresh) and "only the agent is broken" (kubelet Lease fresh) by comparing
// the two, so this heartbeat must keep going whatever else happens on the node: it runs on its
// own goroutine, independent of the checks; each renewal has its own timeout well below the
// renew interval; failures are retried quickly with backoff.
//
// The Lease is named after the node, lives in the agent's namespace, carries the label
// nodevigil.io/node=<node> and an ownerReference to the Node, so the garbage collector deletes
// it with the Node and Leases never pile up. Renewal costs one write: the last Lease returned
// by the API server is kept and updated; it is read again only after a conflict or NotFound.
package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/collectors/wakeup"
)

// NodeLabel is set on every agent Lease with the node name as value, so the remediator can
// select agent Leases with a label selector and map them to Nodes without parsing names.
const NodeLabel = "nodevigil.io/node"

// Defaults, matching the kubelet's own node Lease.
const (
	DefaultLeaseDuration       = 40 * time.Second
	DefaultRenewInterval       = 10 * time.Second
	DefaultRenewTimeout        = 5 * time.Second
	DefaultJitterFactor        = 0.1
	DefaultRetryInitialBackoff = 500 * time.Millisecond
)

// Renewal results, the values of the result label.
const (
	ResultSuccess  = "success"
	ResultConflict = "conflict"
	ResultNotFound = "not_found"
	ResultTimeout  = "timeout"
	ResultError    = "error"
)

// LeaseClient reads and writes Leases in one namespace. It is declared here, not taken from
// client-go, so the agent binary can satisfy it with a client that links only the
// coordination.k8s.io/v1 API group; client-go's typed LeaseInterface
// (clientset.CoordinationV1().Leases(ns)) satisfies it too.
type LeaseClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
}

// NodeGetter reads the Node, whose UID the Lease's ownerReference needs. client-go's typed
// NodeInterface satisfies it.
type NodeGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1.Node, error)
}

// Config configures a Renewer. Zero values are replaced by defaults.
type Config struct {
	// Leases writes the Lease. It must act on Namespace. Required.
	Leases LeaseClient
	// Nodes reads the Node for the Lease's ownerReference. Required.
	Nodes NodeGetter
	// NodeName names the Lease and its owner Node. Required.
	NodeName string
	// Namespace holds the Lease. Required.
	Namespace string
	// HolderIdentity is written as spec.holderIdentity, the agent pod's name. Required.
	HolderIdentity string
	// LeaseDuration is written as spec.leaseDurationSeconds (default 40s).
	LeaseDuration time.Duration
	// RenewInterval is the time between successful renewals before jitter (default 10s).
	RenewInterval time.Duration
	// RenewTimeout bounds one renewal, all API calls included (default min(5s,
	// RenewInterval/2)); it must be below RenewInterval.
	RenewTimeout time.Duration
	// JitterFactor spreads renewals of many nodes: each wait is in
	// [interval, interval*(1+JitterFactor)) (default 0.1).
	JitterFactor float64
	// RetryInitialBackoff is the wait after a first failure; it doubles up to RenewInterval
	// (default 500ms).
	RetryInitialBackoff time.Duration
	// Grid, when on, puts each renewal after a success on the process's shared schedule
	// (package wakeup), with no jitter (the Grid's random Origin spreads a cluster's agents),
	// so it shares its wake-up with the check cycle and the AWS event watcher. Retries after a
	// failure keep their backoff. Off (the zero Grid), each wait is RenewInterval plus jitter.
	Grid wakeup.Grid
	// Clock is the time source (default the real clock).
	Clock clock.WithTicker
	// Rand returns a number in [0,1) for the jitter (default math/rand/v2).
	Rand func() float64
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the metrics (default a private throwaway registry).
	Registerer prometheus.Registerer
}

// Renewer keeps the agent's Lease fresh.
type Renewer struct {
	cfg       Config
	renewals  *prometheus.CounterVec
	lastRenew prometheus.Gauge

	mu    sync.Mutex
	owner *metav1.OwnerReference
	lease *coordinationv1.Lease
	// ownerWarned limits the owner-read warning to once per outage; the renewal failure
	// itself is logged by Run.
	ownerWarned bool
}

// New validates cfg, fills defaults and registers the metrics.
func New(cfg Config) (*Renewer, error) {
	switch {
	case cfg.Leases == nil:
		return nil, errors.New("heartbeat: Leases is required")
	case cfg.Nodes == nil:
		return nil, errors.New("heartbeat: Nodes is required")
	case cfg.NodeName == "":
		return nil, errors.New("heartbeat: NodeName is required")
	case cfg.Namespace == "":
		return nil, errors.New("heartbeat: Namespace is required")
	case cfg.HolderIdentity == "":
		return nil, errors.New("heartbeat: HolderIdentity is required")
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewInterval <= 0 {
		cfg.RenewInterval = DefaultRenewInterval
	}
	if cfg.RenewTimeout <= 0 {
		cfg.RenewTimeout = min(DefaultRenewTimeout, cfg.RenewInterval/2)
	}
	if cfg.RenewInterval >= cfg.LeaseDuration {
		return nil, fmt.Errorf("heartbeat: RenewInterval (%s) must be shorter than LeaseDuration (%s)", cfg.RenewInterval, cfg.LeaseDuration)
	}
	if cfg.RenewTimeout >= cfg.RenewInterval {
		return nil, fmt.Errorf("heartbeat: RenewTimeout (%s) must be shorter than RenewInterval (%s)", cfg.RenewTimeout, cfg.RenewInterval)
	}
	if cfg.JitterFactor <= 0 {
		cfg.JitterFactor = DefaultJitterFactor
	}
	if cfg.RetryInitialBackoff <= 0 {
		cfg.RetryInitialBackoff = DefaultRetryInitialBackoff
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	r := &Renewer{
		cfg: cfg,
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodevigil_agent_lease_renewals_total",
			Help: "Renewals of the agent's heartbeat Lease, by result (success, conflict, not_found, timeout, error).",
		}, []string{"result"}),
		lastRenew: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodevigil_agent_lease_last_renew_timestamp_seconds",
			Help: "Unix time of the last successful renewal of the agent's heartbeat Lease.",
		}),
	}
	for _, c := range []prometheus.Collector{r.renewals, r.lastRenew} {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("heartbeat: register metrics: %w", err)
		}
	}
	for _, res := range []string{ResultSuccess, ResultConflict, ResultNotFound, ResultTimeout, ResultError} {
		r.renewals.WithLabelValues(res)
	}
	return r, nil
}

// Run renews the Lease until ctx is done: every RenewInterval (jittered) after a success,
// sooner with doubling backoff after a failure. It returns when ctx is done.
func (r *Renewer) Run(ctx context.Context) {
	failures := 0
	for {
		wait := r.cfg.RenewInterval
		if err := r.Renew(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			wait = r.cfg.RetryInitialBackoff << min(failures-1, 16)
			if wait > r.cfg.RenewInterval || wait <= 0 {
				wait = r.cfg.RenewInterval
			}
			r.cfg.Logger.Warn("renew heartbeat lease failed", "node", r.cfg.NodeName, "lease", r.cfg.Namespace+"/"+r.cfg.NodeName,
				"attempt", failures, "err", err)
		} else {
			if failures > 0 {
				r.cfg.Logger.Info("heartbeat lease renewed again", "node", r.cfg.NodeName, "attempt", failures)
			}
			failures = 0
		}
		if failures == 0 && r.cfg.Grid.On() {
			now := r.cfg.Clock.Now()
			wait = r.cfg.Grid.Next(now, r.cfg.RenewInterval).Sub(now)
		} else {
			wait += time.Duration(r.cfg.Rand() * r.cfg.JitterFactor * float64(wait))
		}
		t := r.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// Renew performs one renewal within RenewTimeout, creating the Lease if it does not exist,
// and counts the result.
func (r *Renewer) Renew(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RenewTimeout)
	defer cancel()
	err := r.renew(ctx)
	r.renewals.WithLabelValues(classify(err)).Inc()
	if err != nil {
		return fmt.Errorf("renew lease %s/%s: %w", r.cfg.Namespace, r.cfg.NodeName, err)
	}
	r.lastRenew.Set(float64(r.cfg.Clock.Now().UnixNano()) / 1e9)
	return nil
}

func classify(err error) string {
	switch {
	case err == nil:
		return ResultSuccess
	case errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err):
		return ResultTimeout
	case apierrors.IsConflict(err):
		return ResultConflict
	case apierrors.IsNotFound(err):
		return ResultNotFound
	default:
		return ResultError
	}
}

func (r *Renewer) renew(ctx context.Context) error {
	if r.owner == nil {
		r.fetchOwner(ctx)
	}
	if r.lease != nil {
		err := r.update(ctx, r.lease.DeepCopy())
		if err == nil || !(apierrors.IsConflict(err) || apierrors.IsNotFound(err)) {
			return err
		}
		// Someone else wrote the Lease, or it was deleted (perhaps by the garbage collector
		// after the Node was re-created): start again from what the server has.
		r.cfg.Logger.Debug("heartbeat lease out of date, reading it again", "lease", r.cfg.Namespace+"/"+r.cfg.NodeName, "err", err)
		r.lease = nil
		if apierrors.IsNotFound(err) {
			r.owner = nil
			r.fetchOwner(ctx)
		}
	}
	leases := r.cfg.Leases
	existing, err := leases.Get(ctx, r.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: r.cfg.NodeName, Namespace: r.cfg.Namespace}}
		r.apply(lease)
		created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		r.cfg.Logger.Info("heartbeat lease created", "node", r.cfg.NodeName, "lease", r.cfg.Namespace+"/"+r.cfg.NodeName)
		r.lease = created
		return nil
	}
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	return r.update(ctx, existing)
}

// fetchOwner reads the Node's UID for the ownerReference. It is best effort: the heartbeat
// matters more than its garbage collection, so a failure is logged and retried on the next
// renewal while the Lease is still renewed (keeping whatever owner it already has).
func (r *Renewer) fetchOwner(ctx context.Context) {
	node, err := r.cfg.Nodes.Get(ctx, r.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		level := slog.LevelWarn
		if r.ownerWarned {
			level = slog.LevelDebug
		}
		r.ownerWarned = true
		r.cfg.Logger.Log(ctx, level, "read node for lease owner failed", "node", r.cfg.NodeName, "err", err)
		return
	}
	r.ownerWarned = false
	r.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
}

func (r *Renewer) update(ctx context.Context, lease *coordinationv1.Lease) error {
	r.apply(lease)
	updated, err := r.cfg.Leases.Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update: %w", err)
	}
	r.lease = updated
	return nil
}

// apply sets every field the agent owns on lease: label, owner, holder, duration, renew time.
func (r *Renewer) apply(lease *coordinationv1.Lease) {
	now := metav1.NewMicroTime(r.cfg.Clock.Now())
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	lease.Labels[NodeLabel] = r.cfg.NodeName
	if r.owner != nil {
		refs := lease.OwnerReferences[:0:0]
		for _, ref := range lease.OwnerReferences {
			if ref.Kind == "Node" && ref.APIVersion == "v1" {
				continue // replaced below: a re-created Node has a new UID
			}
			refs = append(refs, ref)
		}
		lease.OwnerReferences = append(refs, *r.owner)
	}

	spec := &lease.Spec
	if spec.HolderIdentity == nil || *spec.HolderIdentity != r.cfg.HolderIdentity {
		if spec.HolderIdentity != nil {
			spec.LeaseTransitions = ptr.To(ptr.Deref(spec.LeaseTransitions, 0) + 1)
		}
		spec.HolderIdentity = ptr.To(r.cfg.HolderIdentity)
		spec.AcquireTime = &now
	}
	spec.LeaseDurationSeconds = ptr.To(int32(r.cfg.LeaseDuration / time.Second))
	spec.RenewTime = &now
}
