package remediation

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// This file is the observe step: the informers (setupInformers, the event handlers that feed the
// workqueue) and what the remediator learns from watching, by its own clock.
//
// A Lease's renewTime is written with the node's clock, which may be minutes off, so the
// remediator never compares it with its own time. Like kube-controller-manager's node
// lifecycle controller (which keeps its own probe timestamp per node), it remembers for every
// Lease when it last saw it change — its resourceVersion or its renewTime — and decide judges
// the Lease stale when that was more than its duration plus a grace ago. The first sight of a
// Lease counts as a change, and decide never measures from before the leader's own start, so a
// new leader starts observing from zero.
//
// Time during which this replica could not observe does not count either. While the API server
// is unreachable (or a watch is broken and client-go's reflector is backing off, which can last
// tens of seconds after the API server is back) no Lease changes in the cache, so every Lease
// would look silent and the whole fleet due for termination. Healthy nodes renew their Leases
// every quarter of a duration, so some Lease of a cluster changes many times per duration; an
// observer that sees no change at all for a whole lease duration (its gap) is blind, not
// watching a dead fleet. While any observer is blind, nothing is judged stale; when changes
// arrive again after such a gap, observation restarts from that moment, as for a new leader
// (Controller.observedFrom). A gap shorter than a lease duration cannot make a fresh Lease look
// stale: it ends before duration plus grace.
//
// Quiet alone is no proof of blindness, though: in a one-node cluster, a single-node test
// cluster or a small cluster gone wholly dark, nothing renews because nothing is alive, and a
// remediator that called that blindness would never repair anything there. So a quiet observer
// asks the API server directly (verifyObservation): it lists the Leases it watches — one
// consistent read, in pages, stopping at the first difference — and compares each with its
// cache. If the list fails (the API server is unreachable) or shows a Lease the cache does not
// hold at that resourceVersion (the watch is broken or the reflector still backing off), the
// observer stays blind. If the cache matches the server, the quiet is real: that verification
// counts as a resumption (observation restarts from it, so Leases that stopped only because the
// API server was down for their renewers too get a whole lease duration plus grace to renew),
// and the observer stays seeing for as long as such verifications keep succeeding
// (verifyMaxAge). Watch errors reported by client-go are no usable signal here: while the API
// server refuses connections the reflector retries its watch internally without reporting.

// leaseObserver remembers, per Lease name, when this replica last saw the Lease change. At
// 10,000 nodes it holds two maps of 10,000 small entries (the key shares the cached Lease's
// name; the value is 16 bytes). Entries go when the Lease or the Node is deleted.
type leaseObserver struct {
	mu   sync.Mutex
	seen map[string]observation
	// gap is how long no Lease may change before the observer counts itself blind: the
	// duration of the Leases it watches.
	gap time.Duration
	// lastEvent is when any Lease last changed (UnixNano, the controller's clock); resumedAt
	// when changes arrived again after a gap of at least gap, or a verification found a quiet
	// cache current (0 if never); gaps counts those.
	lastEvent, resumedAt int64
	gaps                 int
	// verifiedAt is when a direct read of the API server last found the cache current while
	// the observer was quiet (0: not since it last failed or found the cache behind).
	verifiedAt int64
}

// verifyMaxAge is how long a verification that found a quiet cache current keeps the observer
// seeing: a quarter of its gap (the grace decide adds to a Lease's duration), re-verified every
// verifyInterval, so a renewal the watch misses is noticed well within the grace.
func (o *leaseObserver) verifyMaxAge() time.Duration { return o.gap / 4 }

// verifyInterval is how often a quiet observer is verified.
func (o *leaseObserver) verifyInterval() time.Duration { return o.gap / 8 }

// observation is one Lease's last observed change.
type observation struct {
	at int64  // UnixNano, the controller's clock
	fp uint64 // fingerprint of resourceVersion and renewTime as then seen
}

func newLeaseObserver(gap time.Duration) *leaseObserver {
	return &leaseObserver{seen: map[string]observation{}, gap: gap}
}

// fingerprint identifies a Lease's state: any write changes the resourceVersion, and a
// renewal changes renewTime, whatever clock wrote it (even backwards).
func fingerprint(l *coordinationv1.Lease) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(l.ResourceVersion))
	var b [9]byte
	if l.Spec.RenewTime != nil {
		b[0] = 1
		binary.LittleEndian.PutUint64(b[1:], uint64(l.Spec.RenewTime.UnixNano()))
	}
	_, _ = h.Write(b[:])
	return h.Sum64()
}

// observe records l as seen at now. It returns whether l differs from what was last seen (a
// first sight is a change) and when the previous change was seen (zero on first sight).
func (o *leaseObserver) observe(l *coordinationv1.Lease, now time.Time) (changed bool, prev time.Time) {
	fp := fingerprint(l)
	o.mu.Lock()
	defer o.mu.Unlock()
	old, ok := o.seen[l.Name]
	if ok {
		prev = time.Unix(0, old.at)
		if old.fp == fp {
			return false, prev
		}
	}
	o.seen[l.Name] = observation{at: now.UnixNano(), fp: fp}
	if o.lastEvent != 0 && now.Sub(time.Unix(0, o.lastEvent)) >= o.gap {
		o.resumedAt = now.UnixNano()
		o.gaps++
	}
	o.lastEvent = max(o.lastEvent, now.UnixNano())
	return true, prev
}

// blindness reports whether the observer is blind at now — it knows Leases, has seen none
// change for its gap, and no recent verification found its cache current — and since when it
// is quiet, and when it last resumed (zero if never).
func (o *leaseObserver) blindness(now time.Time) (blind bool, since, resumed time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.resumedAt != 0 {
		resumed = time.Unix(0, o.resumedAt)
	}
	if !o.quietLocked(now) {
		return false, time.Time{}, resumed
	}
	return !o.verifiedLocked(now), time.Unix(0, o.lastEvent), resumed
}

// quiet reports whether the observer knows Leases and has seen none change for its gap: the
// moment to verify its cache against the API server.
func (o *leaseObserver) quiet(now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.quietLocked(now)
}

func (o *leaseObserver) quietLocked(now time.Time) bool {
	return len(o.seen) > 0 && o.lastEvent != 0 && now.Sub(time.Unix(0, o.lastEvent)) >= o.gap
}

func (o *leaseObserver) verifiedLocked(now time.Time) bool {
	return o.verifiedAt != 0 && now.Sub(time.Unix(0, o.verifiedAt)) <= o.verifyMaxAge()
}

// verified records a verification at now: current says the API server's Leases matched the
// cache. The first success while blind is a resumption (observation restarts from it); a
// failure makes the observer blind again at once.
func (o *leaseObserver) verified(now time.Time, current bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !current {
		o.verifiedAt = 0
		return
	}
	if !o.verifiedLocked(now) {
		o.resumedAt = now.UnixNano()
		o.gaps++
	}
	o.verifiedAt = now.UnixNano()
}

func (o *leaseObserver) gapCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.gaps
}

// lastChange returns when the Lease named name was last seen changing; zero if never.
func (o *leaseObserver) lastChange(name string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ob, ok := o.seen[name]; ok {
		return time.Unix(0, ob.at)
	}
	return time.Time{}
}

func (o *leaseObserver) forget(name string) {
	o.mu.Lock()
	delete(o.seen, name)
	o.mu.Unlock()
}

func (o *leaseObserver) size() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.seen)
}

// verifyTimeout bounds one verification (all pages of one Lease list).
const verifyTimeout = 10 * time.Second

// verifyPageSize is the page size of a verification's Lease list: one page at a time, so the
// first difference ends it and a verification of a large dark fleet never holds it all.
const verifyPageSize = 500

// runObservationVerifier verifies the quiet observers every verifyInterval until ctx ends.
func (c *Controller) runObservationVerifier(ctx context.Context) {
	t := c.clock.NewTicker(min(c.kubeletObs.verifyInterval(), c.agentObs.verifyInterval()))
	defer t.Stop()
	for {
		c.verifyObservation(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// verifyObservation asks the API server, for each observer that has been quiet for its gap,
// whether its cache is current (see the top of this file), and records the answer. It does
// nothing while Leases change.
func (c *Controller) verifyObservation(ctx context.Context) {
	for _, v := range []struct {
		leases, ns, selector string
		obs                  *leaseObserver
		cached               coordinationlisters.LeaseNamespaceLister
	}{
		{"kubelet", c.cfg.KubeletLeaseNamespace, "", c.kubeletObs, c.kubeletLeases},
		{"agent", c.rc.AgentNamespace, LabelAgentNode, c.agentObs, c.agentLeases},
	} {
		if !v.obs.quiet(c.clock.Now()) {
			continue
		}
		current, err := c.leaseCacheCurrent(ctx, v.ns, v.selector, v.cached)
		result := "current"
		switch {
		case err != nil:
			result = "failed"
			c.log.Debug("observation not verified", "leases", v.leases, "err", err)
		case !current:
			result = "behind"
			c.log.Debug("observation behind the api server", "leases", v.leases)
		}
		c.verifications.WithLabelValues(v.leases, result).Inc()
		v.obs.verified(c.clock.Now(), err == nil && current)
	}
}

// leaseCacheCurrent reports whether the Leases of ns matching selector on the API server are
// exactly those of cached, each at the same resourceVersion. It reads the API server directly
// (a consistent list, in pages) and stops at the first difference.
func (c *Controller) leaseCacheCurrent(ctx context.Context, ns, selector string, cached coordinationlisters.LeaseNamespaceLister) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	all, err := cached.List(labels.Everything())
	if err != nil {
		return false, fmt.Errorf("list cached leases of %s: %w", ns, err)
	}
	opts := metav1.ListOptions{LabelSelector: selector, Limit: verifyPageSize}
	n := 0
	for {
		page, err := c.client.CoordinationV1().Leases(ns).List(ctx, opts)
		if err != nil {
			return false, fmt.Errorf("list leases of %s: %w", ns, err)
		}
		for i := range page.Items {
			l := &page.Items[i]
			got, err := cached.Get(l.Name)
			if err != nil || got.ResourceVersion != l.ResourceVersion {
				return false, nil
			}
		}
		n += len(page.Items)
		if page.Continue == "" {
			return n == len(all), nil
		}
		opts.Continue = page.Continue
	}
}

// leaseDuration is the Lease's own duration, or fallback.
func leaseDuration(l *coordinationv1.Lease, fallback time.Duration) time.Duration {
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return fallback
}

// registerObserveMetrics registers the gauges of what is observed. They are computed when
// scraped, so followers report them too.
func (c *Controller) registerObserveMetrics() error {
	const ns, sub = "nodevigil", "remediator"
	c.verifications = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "observation_verifications_total",
		Help: "Direct reads of the API server's Leases made because no Lease had changed for a lease duration, by leases (kubelet, agent) and result: current (the quiet is real: nodes are silent, not unobserved), behind (the watch missed changes) or failed (the API server did not answer).",
	}, []string{"leases", "result"})
	for _, g := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "agent_leases",
			Help: "Agent heartbeat Leases this replica sees (namespace agentNamespace, label " + LabelAgentNode + "). 0 with nodes in the cluster means the agents are missing or misconfigured.",
		}, func() float64 { return float64(c.agentObs.size()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "observation_blind",
			Help: "1 while no kubelet or agent Lease has changed for a lease duration and a direct read of the API server could not confirm the cache (the API server is unreachable or the watch is behind); nothing is judged stale meanwhile, and observation restarts from zero afterwards.",
		}, func() float64 {
			now := c.clock.Now()
			for _, o := range []*leaseObserver{c.kubeletObs, c.agentObs} {
				if b, _, _ := o.blindness(now); b {
					return 1
				}
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "observation_gaps_total",
			Help: "Times observation resumed — Lease changes arrived again after none for a lease duration, or a direct read confirmed a quiet cache; each restarted observation from zero.",
		}, func() float64 { return float64(c.kubeletObs.gapCount() + c.agentObs.gapCount()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "agents_missing",
			Help: "1 while no agent Lease exists for any node after the startup grace: a misconfiguration; under liveness TwoSignal nothing is remediated meanwhile.",
		}, func() float64 {
			if missing, _ := c.agentsMissing(c.clock.Now()); missing {
				return 1
			}
			return 0
		}),
		c.verifications,
	} {
		if err := c.registry.Register(g); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// minStartupGrace is the shortest startupGrace of any policy: how long after the informers
// synced a cluster without a single agent Lease is called misconfigured.
func (c *Controller) minStartupGrace() time.Duration {
	g := c.rc.Policies[0].StartupGrace
	for _, p := range c.rc.Policies[1:] {
		g = min(g, p.StartupGrace)
	}
	return g
}

// agentsMissing reports whether, past the startup grace since the caches synced, nodes exist
// but not one agent Lease does, and says what to check.
func (c *Controller) agentsMissing(now time.Time) (bool, string) {
	synced := c.syncedAt.Load()
	if synced == 0 || c.agentObs.size() > 0 {
		return false, ""
	}
	since := time.Unix(0, synced)
	if now.Sub(since) < c.minStartupGrace() {
		return false, ""
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil || len(nodes) == 0 {
		return false, ""
	}
	var single []string
	for _, p := range c.rc.Policies {
		if p.Liveness == config.LivenessSingleSignal {
			single = append(single, p.Name)
		}
	}
	msg := fmt.Sprintf("no nodevigil agent Lease seen for any of %d nodes since %s: check that the agent DaemonSet runs and that agentNamespace (%q) and the Lease label %s match it; "+
		"policies with liveness TwoSignal remediate nothing meanwhile", len(nodes), since.UTC().Format(time.RFC3339), c.rc.AgentNamespace, LabelAgentNode)
	if len(single) > 0 {
		msg += fmt.Sprintf(" (policies with liveness SingleSignal still act on the kubelet alone: %v)", single)
	}
	return true, msg
}

// checkAgents logs when the agents-missing misconfiguration begins and ends; the leader calls
// it on every census tick.
func (c *Controller) checkAgents(now time.Time) {
	missing, msg := c.agentsMissing(now)
	if c.agentsMissingLogged.Swap(missing) == missing {
		return
	}
	if missing {
		c.log.Error("no agent leases seen", "reason", decide.ReasonNoAgentLeases, "agent_namespace", c.rc.AgentNamespace, "message", msg)
		return
	}
	c.log.Info("agent leases seen", "agent_namespace", c.rc.AgentNamespace, "leases", c.agentObs.size())
}

// scopeEmpty reports whether the caches synced and a configured nodeSelector matches no Node:
// a selector with a typo would otherwise make a remediator that silently watches nothing.
func (c *Controller) scopeEmpty() bool {
	if c.rc.NodeSelector == "" || !c.Ready() {
		return false
	}
	nodes, err := c.nodes.List(labels.Everything())
	return err == nil && len(nodes) == 0
}

// readyzDetail is the warning /readyz adds to its body, or "".
func (c *Controller) readyzDetail() []string {
	var out []string
	if c.scopeEmpty() {
		out = append(out, fmt.Sprintf("warning: nodeSelector %q matches no node: nothing is watched or remediated", c.rc.NodeSelector))
	}
	if missing, msg := c.agentsMissing(c.clock.Now()); missing {
		out = append(out, "warning: "+msg)
	}
	return slices.Clip(out)
}

// setupInformers builds the informers of Nodes, kubelet Leases and agent Leases and registers
// the handlers that feed the Lease observers and the workqueue.
func (c *Controller) setupInformers() error {
	cfg := c.cfg
	// Each factory holds one informer, built by strippedInformer (transform.go) so that objects
	// are stripped as they arrive, not only once an initial list has ended; the factories add
	// the same transform to it (applied to LIST results) and start and stop it.
	// Nodes outside the configured scope (nodeSelector) are never listed, so nothing downstream
	// (census, decide, pipeline, first-ready writer) can judge or touch them.
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod, informers.WithTransform(stripNode))
	nodeFactory.InformerFor(&corev1.Node{}, nodeInformer(cfg.Remediator.NodeSelector))
	kubeletFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod,
		informers.WithNamespace(cfg.KubeletLeaseNamespace), informers.WithTransform(stripLease))
	kubeletFactory.InformerFor(&coordinationv1.Lease{}, leaseInformer(cfg.KubeletLeaseNamespace, ""))
	agentFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod,
		informers.WithNamespace(cfg.Remediator.AgentNamespace), informers.WithTransform(stripLease))
	agentFactory.InformerFor(&coordinationv1.Lease{}, leaseInformer(cfg.Remediator.AgentNamespace, LabelAgentNode))
	c.factories = []informers.SharedInformerFactory{nodeFactory, kubeletFactory, agentFactory}

	nodeInf := nodeFactory.Core().V1().Nodes()
	kubeletInf := kubeletFactory.Coordination().V1().Leases()
	agentInf := agentFactory.Coordination().V1().Leases()
	c.nodes = nodeInf.Lister()
	c.kubeletLeases = kubeletInf.Lister().Leases(cfg.KubeletLeaseNamespace)
	c.agentLeases = agentInf.Lister().Leases(cfg.Remediator.AgentNamespace)

	regs := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{nodeInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.enqueueObject(obj) },
			UpdateFunc: func(_, obj any) { c.enqueueObject(obj) },
			DeleteFunc: c.nodeDeleted,
		}},
		{kubeletInf.Informer(), c.leaseHandler(c.kubeletObs, decide.DefaultKubeletLeaseDuration)},
		{agentInf.Informer(), c.leaseHandler(c.agentObs, cfg.Remediator.AgentLeaseDuration)},
	}
	for _, r := range regs {
		reg, err := r.inf.AddEventHandler(r.h)
		if err != nil {
			return fmt.Errorf("remediation: add event handler: %w", err)
		}
		// Synced once the handler, not only the cache, has seen the initial list: the Lease
		// observers must know every Lease before anything is judged.
		c.synced = append(c.synced, reg.HasSynced)
	}
	return nil
}

func (c *Controller) enqueueObject(obj any) {
	if n, ok := obj.(metav1.Object); ok {
		c.queue.Add(n.GetName())
	}
}

func (c *Controller) nodeDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	n, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	c.forget(n.GetName())
	c.kubeletObs.forget(n.GetName())
	c.agentObs.forget(n.GetName())
	c.queue.Add(n.GetName())
}

// leaseHandler records every change of a Lease in obs, by the controller's clock, and enqueues
// the node when it can matter. Lease renewals are the bulk of all events (two per node every
// 10 s); a renewal of a Lease that was fresh changes no decision, since the node is already
// requeued for the moment that Lease would go stale. So an update is enqueued only when the
// Lease had gone stale before this change (a node coming back), the node is being watched for a
// problem, or it is a periodic resync.
func (c *Controller) leaseHandler(obs *leaseObserver, fallback time.Duration) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if l, ok := obj.(*coordinationv1.Lease); ok {
				obs.observe(l, c.clock.Now())
			}
			c.enqueueObject(obj)
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*coordinationv1.Lease)
			n, ok2 := newObj.(*coordinationv1.Lease)
			if !ok1 || !ok2 {
				c.enqueueObject(newObj)
				return
			}
			now := c.clock.Now()
			changed, prev := obs.observe(n, now)
			wasStale := changed && (prev.IsZero() || !now.Before(prev.Add(decide.StaleAfter(leaseDuration(n, fallback)))))
			if o.ResourceVersion == n.ResourceVersion || wasStale || c.watched(n.Name) {
				c.queue.Add(n.Name)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if l, ok := obj.(metav1.Object); ok {
				obs.forget(l.GetName())
			}
			c.enqueueObject(obj)
		},
	}
}

func (c *Controller) observingSinceTime() time.Time {
	ns := c.observingSince.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// observedFrom is the ObservingSince decide is given at now: when this replica began leading,
// or later when its observation was interrupted (see the top of this file). While an observer
// is blind it is now itself, so nothing is judged stale and no step is taken; after a gap it is
// the moment changes arrived again, so the node is judged as by a new leader. It logs the
// beginning and end of blindness once each.
func (c *Controller) observedFrom(now time.Time) time.Time {
	from := c.observingSinceTime()
	if from.IsZero() {
		return from
	}
	blind := false
	var since time.Time
	for _, o := range []*leaseObserver{c.kubeletObs, c.agentObs} {
		b, s, resumed := o.blindness(now)
		if resumed.After(from) {
			from = resumed
		}
		if b {
			blind = true
			if since.IsZero() || s.Before(since) {
				since = s
			}
		}
	}
	if c.blindLogged.Swap(blind) != blind {
		if blind {
			c.log.Warn("no lease changed for a lease duration: not observing; judging nothing stale until leases change again", "since", since.UTC().Format(time.RFC3339))
		} else {
			c.log.Info("leases change again: observing from zero", "since", from.UTC().Format(time.RFC3339), "duration", c.observe)
		}
	}
	if blind {
		return now
	}
	return from
}
