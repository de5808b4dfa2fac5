package remediation

import (
	"fmt"
	"time"

	"golang.org/x/time/rate"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// Zone labels, the current one first.
var zoneLabels = []string{corev1.LabelTopologyZone, corev1.LabelFailureDomainBetaZone}

func zoneOf(node *corev1.Node) string {
	for _, l := range zoneLabels {
		if z := node.Labels[l]; z != "" {
			return z
		}
	}
	return ""
}

// census is a cluster-wide count of the decisions, the input of every safety rail. It is
// recomputed from the caches (Decide on every node) at most once per DefaultCensusMaxAge when a
// rail is checked, and every DefaultCensusInterval for the gauges: at 10,000 nodes a pass costs
// tens of milliseconds, and rails are checked only when a pipeline step is about to be taken.
//
// The caps (maxUnhealthy, maxInFlight) count per pool: config.Config.PoolOf, the policy and
// the value of the pool label, so one policy spanning several pools cannot let one pool's
// trouble use another's budget. The storm valves (zone, cluster) count every impaired node —
// silent, or unhealthy by any verdict — whatever its pool.
//
// maxInFlight is one budget per pool, shared by remediation and AWS interruptions: a pool's
// slots are held by the nodes in the remediation pipeline (inFlight) and by the nodes
// nodevigil holds cordoned for an interruption (interrupting), and both sides check the same
// count (inFlightLocked) before taking one. Spot notices and ASG terminations within the
// interruptions valve do not wait for a slot (AWS has decided), but while they run they count,
// so neither a judgement nor a scheduled drain adds to a pool they are already emptying.
type census struct {
	at       time.Time
	pools    map[string]*poolCount // pool key → counts
	zones    map[string]*zoneCount
	cluster  zoneCount
	inFlight map[string]string // node → pool key of every node seen mid-pipeline
	// interrupting maps every node nodevigil holds cordoned for an AWS interruption (its
	// nodevigil.io/interruption mark) to its pool key.
	interrupting map[string]string
	reasons      map[string]int // decision reason → nodes
	blocked      map[string]int // block reason → nodes recorded Blocked
	draining     int
}

type poolCount struct {
	policy                     string
	total, unhealthy, inFlight int
}

// zoneCount counts the nodes of a zone (or the cluster): silent ones for the gauge, impaired
// ones (silent or unhealthy) for the pause.
type zoneCount struct{ total, silent, impaired int }

// reservation counts a node the controller is marking until the cache shows the mark, so two
// workers cannot both squeeze under maxInFlight in the instant before the informer catches up.
type reservation struct {
	pool string
	at   time.Time
}

// reservationTTL bounds how long a reservation is kept when the cache never shows the mark
// (the node was deleted, say).
const reservationTTL = 5 * time.Minute

// inPipeline reports whether a node in phase counts against maxInFlight (see
// decide.Phase.HoldsSlot).
func inPipeline(phase decide.Phase, p *config.Policy) bool { return phase.HoldsSlot(p.Action) }

// blockedReason returns the reason of a node recorded Blocked and not (again) in the pipeline.
func blockedReason(node *corev1.Node) string {
	if decide.PhaseOf(node) != decide.PhaseNone {
		return ""
	}
	return node.Annotations[decide.AnnotationBlocked]
}

// poolKey is the key the caps of p count node under.
func (c *Controller) poolKey(node *corev1.Node, p *config.Policy) string {
	return c.rc.PoolOf(p, node.Labels)
}

// computeCensus counts every node in the cache. gateMu must be held.
func (c *Controller) computeCensus(now time.Time) *census {
	cs := &census{at: now, pools: map[string]*poolCount{}, zones: map[string]*zoneCount{}, inFlight: map[string]string{},
		interrupting: map[string]string{}, reasons: map[string]int{}, blocked: map[string]int{}}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		c.log.Error("list nodes from cache", "err", err)
	}
	for _, n := range nodes {
		p := c.rc.PolicyFor(n.Labels)
		in := c.input(n, p, now)
		in.NoMessage = true
		d := decide.Decide(in)
		cs.reasons[d.Reason]++
		key := c.poolKey(n, p)
		pc := cs.pools[key]
		if pc == nil {
			pc = &poolCount{policy: p.Name}
			cs.pools[key] = pc
		}
		pc.total++
		blocked := blockedReason(n)
		if blocked != "" {
			cs.blocked[blocked]++
		}
		// A Blocked node is not counted against maxUnhealthy: it will not be remediated, and
		// counting it would let one foreign instance use up a small pool's budget for ever. It
		// still counts towards the storm valves below.
		if d.Unhealthy && blocked == "" {
			pc.unhealthy++
		}
		phase := decide.PhaseOf(n)
		if inPipeline(phase, p) {
			pc.inFlight++
			cs.inFlight[n.Name] = key
		}
		if phase == decide.PhaseDraining {
			cs.draining++
		}
		if _, ok := n.Annotations[AnnotationInterruption]; ok {
			cs.interrupting[n.Name] = key
		}
		impaired := d.Silent || d.Unhealthy
		cs.cluster.add(d.Silent, impaired)
		if z := zoneOf(n); z != "" {
			zc := cs.zones[z]
			if zc == nil {
				zc = &zoneCount{}
				cs.zones[z] = zc
			}
			zc.add(d.Silent, impaired)
		}
	}
	// A reservation whose mark (remediation's phase, or the interruption mark) the cache now
	// shows is counted by the census itself (or, for a CordonOnly node already cordoned, no
	// longer counts at all).
	for name, r := range c.reservations {
		n, err := c.nodes.Get(name)
		_, interrupting := cs.interrupting[name]
		seen := err == nil && (decide.PhaseOf(n) != decide.PhaseNone || interrupting)
		if seen || now.Sub(r.at) > reservationTTL {
			delete(c.reservations, name)
		}
	}
	return cs
}

func (zc *zoneCount) add(silent, impaired bool) {
	zc.total++
	if silent {
		zc.silent++
	}
	if impaired {
		zc.impaired++
	}
}

// currentCensus returns a census no older than DefaultCensusMaxAge. gateMu must be held.
//
// A census taken a little after now is current too: workers read the clock before waiting for
// gateMu, so when many nodes are due at once (50 failing together) each finds the census a
// previous worker just took "in its future". Recomputing it then cost every rail check a full
// pass over the cluster, one after the other under the lock: 10 s from toleration expiry to the
// first patch at 10,000 nodes (docs/benchmarks.md). Only a census more than the maximum age
// ahead (a clock stepped back) is recomputed.
func (c *Controller) currentCensus(now time.Time) *census {
	if c.census == nil || now.Sub(c.census.at) >= DefaultCensusMaxAge || c.census.at.Sub(now) >= DefaultCensusMaxAge {
		c.setCensus(c.computeCensus(now))
	}
	return c.census
}

// refreshCensus recomputes the census for the gauges and the pause logs.
func (c *Controller) refreshCensus(now time.Time) {
	c.gateMu.Lock()
	defer c.gateMu.Unlock()
	c.setCensus(c.computeCensus(now))
}

// setCensus installs cs, updates the gauges and logs pauses that began or ended. gateMu must be
// held.
func (c *Controller) setCensus(cs *census) {
	prev := c.census
	c.census = cs

	c.metrics.silentNodes.Reset()
	silentNoZone := cs.cluster.silent
	for z, zc := range cs.zones {
		c.metrics.silentNodes.WithLabelValues(z).Set(float64(zc.silent))
		silentNoZone -= zc.silent
	}
	c.metrics.silentNodes.WithLabelValues("unknown").Set(float64(silentNoZone))
	inFlight := len(cs.inFlight)
	for name := range c.reservations {
		if _, ok := cs.inFlight[name]; !ok {
			inFlight++
		}
	}
	c.metrics.inFlight.Set(float64(inFlight))
	for _, r := range decide.Reasons {
		c.metrics.nodes.WithLabelValues(r).Set(float64(cs.reasons[r]))
	}
	byPolicy := map[string]int{}
	for i := range c.rc.Policies {
		byPolicy[c.rc.Policies[i].Name] = 0
	}
	for _, pc := range cs.pools {
		byPolicy[pc.policy] += pc.unhealthy
	}
	for name, n := range byPolicy {
		c.metrics.unhealthyNodes.WithLabelValues(name).Set(float64(n))
	}
	for _, r := range terminalBlocks {
		c.metrics.blockedNodes.WithLabelValues(r).Set(float64(cs.blocked[r]))
	}
	c.metrics.drainingNodes.Set(float64(cs.draining))

	wasCluster := prev != nil && prev.clusterPaused(c.rc) != ""
	if msg := cs.clusterPaused(c.rc); msg != "" {
		c.metrics.clusterPaused.Set(1)
		if !wasCluster {
			c.log.Warn("remediation paused cluster-wide", "reason", BlockClusterPaused, "message", msg)
		}
	} else {
		if wasCluster {
			c.pauseEnded[""] = cs.at
			c.log.Info("remediation pause ended cluster-wide; settling", "settle", c.pauseSettle())
		}
		_, settling := c.settling("", cs.at)
		c.metrics.clusterPaused.Set(b2f(settling))
	}
	c.metrics.zonePaused.Reset()
	for z := range cs.zones {
		was := prev != nil && prev.zonePaused(c.rc, z) != ""
		if msg := cs.zonePaused(c.rc, z); msg != "" {
			c.metrics.zonePaused.WithLabelValues(z).Set(1)
			if !was {
				c.log.Warn("remediation paused in zone", "zone", z, "reason", BlockZonePaused, "message", msg)
			}
		} else {
			if was {
				c.pauseEnded[z] = cs.at
				c.log.Info("remediation pause ended in zone; settling", "zone", z, "settle", c.pauseSettle())
			}
			_, settling := c.settling(z, cs.at)
			c.metrics.zonePaused.WithLabelValues(z).Set(b2f(settling))
		}
	}
}

// pauseSettle is how long steps stay held after a storm pause ends: one agent heartbeat
// period and its grace (decide.StaleAfter of agentLeaseDuration, 50 s by default). A pause ends
// when enough nodes are seen renewing again, but the nodes that healed with them renew on their
// own schedules; until each has had a full period to be seen, a healed node can still look
// silent — and be past its toleration, since its silence began with the storm. The kubelet
// renews every quarter of its own Lease's duration (10 s by default), well inside the period.
func (c *Controller) pauseSettle() time.Duration {
	return decide.StaleAfter(c.rc.AgentLeaseDuration)
}

// settling returns why steps in scope ("" for the whole cluster, else a zone) are still held
// after a storm pause there ended, or false once the settle period is over. gateMu must be held.
func (c *Controller) settling(scope string, now time.Time) (string, bool) {
	ended, ok := c.pauseEnded[scope]
	if !ok {
		return "", false
	}
	until := ended.Add(c.pauseSettle())
	if !now.Before(until) {
		return "", false
	}
	where := "cluster-wide"
	if scope != "" {
		where = "in zone " + scope
	}
	return fmt.Sprintf("the storm pause %s ended at %s; every step stays held until %s, so each healed node is seen renewing before anything is judged dead",
		where, ended.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339)), true
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// clusterPaused returns why remediation is paused cluster-wide, or "".
func (cs *census) clusterPaused(rc *config.Config) string {
	allowed := config.PauseAllowed(rc.ClusterPauseThreshold, cs.cluster.total)
	if cs.cluster.impaired > allowed {
		return fmt.Sprintf("%d of %d nodes are silent or unhealthy, more than clusterPauseThreshold %s (%d nodes): this looks like a control-plane or network problem, not dead machines; all remediation is paused",
			cs.cluster.impaired, cs.cluster.total, rc.ClusterPauseThreshold.String(), allowed)
	}
	return ""
}

// zonePaused returns why remediation is paused in zone, or "".
func (cs *census) zonePaused(rc *config.Config, zone string) string {
	zc := cs.zones[zone]
	if zc == nil {
		return ""
	}
	allowed := config.PauseAllowed(rc.ZonePauseThreshold, zc.total)
	if zc.impaired > allowed {
		return fmt.Sprintf("%d of %d nodes in zone %s are silent or unhealthy, more than zonePauseThreshold %s (%d nodes): remediation in the zone is paused",
			zc.impaired, zc.total, zone, rc.ZonePauseThreshold.String(), allowed)
	}
	return ""
}

// step names the pipeline step a rail is checked for.
type step int

const (
	stepMark step = iota
	stepCordon
	stepDrain
	stepTerminate
	stepDryRun
)

// checkRails applies the safety rails to node before step and returns the block reason and
// message, or "" when the step may proceed. Pauses and maxUnhealthy apply to every step before
// the point of no return (mark, cordon, each drain pass, the termination request), so a storm
// that begins mid-pipeline stops the nodes already in it too; maxInFlight only to marking (a
// node already in the pipeline is in flight); dry-run checks no maxInFlight (nothing is ever in
// flight) and takes no rate-limiter token. gateMu must be held.
func (c *Controller) checkRails(node *corev1.Node, p *config.Policy, s step, now time.Time) (string, string) {
	cs := c.currentCensus(now)
	if msg := cs.clusterPaused(c.rc); msg != "" {
		return BlockClusterPaused, msg
	}
	if msg, ok := c.settling("", now); ok {
		return BlockClusterPaused, msg
	}
	if z := zoneOf(node); z != "" {
		if msg := cs.zonePaused(c.rc, z); msg != "" {
			return BlockZonePaused, msg
		}
		if msg, ok := c.settling(z, now); ok {
			return BlockZonePaused, msg
		}
	}
	key := c.poolKey(node, p)
	pc := cs.pools[key]
	if pc == nil {
		pc = &poolCount{policy: p.Name}
	}
	if allowed := p.AllowedUnhealthy(pc.total); pc.unhealthy > allowed {
		return BlockMaxUnhealthy, fmt.Sprintf("%d of %d nodes of pool %s are unhealthy, more than maxUnhealthy %s (%d nodes): this smells of a wider problem; remediation in the pool is paused",
			pc.unhealthy, pc.total, key, p.MaxUnhealthy.String(), allowed)
	}
	if s == stepMark {
		inFlight := c.inFlightLocked(cs, key, node.Name)
		if inFlight >= p.MaxInFlight {
			return BlockMaxInFlight, fmt.Sprintf("%d nodes of pool %s are already being remediated or cordoned for AWS interruptions (maxInFlight %d)", inFlight, key, p.MaxInFlight)
		}
	}
	return "", ""
}

// railsBlock checks the rails for step and reports a block; it returns true when blocked.
func (c *Controller) railsBlock(node *corev1.Node, p *config.Policy, s step, now time.Time) bool {
	c.gateMu.Lock()
	reason, msg := c.checkRails(node, p, s, now)
	c.gateMu.Unlock()
	if reason == "" {
		return false
	}
	c.blocked(node, reason, msg)
	return true
}

// inFlightLocked counts the nodes of pool holding one of its maxInFlight slots, other than
// self: those the census saw in the remediation pipeline or cordoned for an interruption, and
// those reserved since by either side. gateMu must be held.
func (c *Controller) inFlightLocked(cs *census, pool, self string) int {
	names := map[string]bool{}
	for _, m := range []map[string]string{cs.inFlight, cs.interrupting} {
		for n, p := range m {
			if p == pool && n != self {
				names[n] = true
			}
		}
	}
	for n, r := range c.reservations {
		if r.pool == pool && n != self {
			names[n] = true
		}
	}
	return len(names)
}

// reserveLocked counts node as in flight in pool until the cache shows its mark. gateMu must
// be held.
func (c *Controller) reserveLocked(node string, pool string, now time.Time) {
	c.reservations[node] = reservation{pool: pool, at: now}
}

// unreserve gives a reservation back (the node was not marked after all).
func (c *Controller) unreserve(node string) {
	c.gateMu.Lock()
	delete(c.reservations, node)
	c.gateMu.Unlock()
}

// takeTermination takes a token from the termination rate limiter, or returns how long until
// one is available. The limiter is driven by the controller's clock, so tests step it. The
// caller cancels the returned reservation if the termination is not requested after all.
func (c *Controller) takeTermination(now time.Time) (*rate.Reservation, time.Duration) {
	r := c.limiter.ReserveN(now, 1)
	if !r.OK() {
		return nil, c.cfg.BlockedRequeue
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return nil, d
	}
	return r, 0
}
