package remediation

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// metrics are the remediator's Prometheus metrics. No label ever carries a node name: at
// 10,000 nodes that would be 10,000 series per metric. Zones and policy names are bounded by
// the cluster's topology and the config file.
type metrics struct {
	silentNodes      *prometheus.GaugeVec
	nodes            *prometheus.GaugeVec
	unhealthyNodes   *prometheus.GaugeVec
	zonePaused       *prometheus.GaugeVec
	clusterPaused    prometheus.Gauge
	decisions        *prometheus.CounterVec
	terminations     *prometheus.CounterVec
	blocked          *prometheus.CounterVec
	inFlight         prometheus.Gauge
	isLeader         prometheus.Gauge
	detection        *prometheus.HistogramVec
	terminateLatency prometheus.Histogram
	blockedNodes     *prometheus.GaugeVec
	cloudErrors      *prometheus.CounterVec
	drainingNodes    prometheus.Gauge
	firstReadyQueued prometheus.Gauge
}

// Block reasons: why a remediation step was not taken. They label
// nodevigil_remediator_blocked_total and are the Event reasons on the Node.
const (
	BlockMaxUnhealthy      = "MaxUnhealthyExceeded"
	BlockMaxInFlight       = "MaxInFlightReached"
	BlockZonePaused        = "ZonePaused"
	BlockClusterPaused     = "ClusterPaused"
	BlockRateLimited       = "RateLimited"
	BlockInvalidProviderID = "InvalidProviderID"
	BlockNotOwned          = "InstanceNotOwned"
	BlockUnauthorized      = "Unauthorized"
	BlockEvictionRefused   = "EvictionBlocked"
	BlockDoNotDisrupt      = "DoNotDisrupt"
	BlockDrainTimeout      = "DrainTimedOut"
	BlockNotFound          = "InstanceNotFound"
)

// terminalBlocks are the block reasons retrying cannot fix: the node is handed back and
// recorded Blocked (decide.AnnotationBlocked) instead of holding its pool.
var terminalBlocks = []string{BlockInvalidProviderID, BlockNotOwned, BlockUnauthorized, BlockNotFound}

var blockReasons = []string{
	BlockMaxUnhealthy, BlockMaxInFlight, BlockZonePaused, BlockClusterPaused, BlockRateLimited,
	BlockInvalidProviderID, BlockNotOwned, BlockUnauthorized, BlockEvictionRefused, BlockDoNotDisrupt,
	BlockDrainTimeout, BlockNotFound,
}

var terminateResults = []TerminateResult{
	ResultTerminating, ResultAlreadyTerminated, ResultNotOwned, ResultNotFound, ResultUnauthorized,
	ResultFailed, ResultDryRun,
}

// detectionReasons are the verdicts whose onset is a Lease expiry, the start of detection
// latency.
var detectionReasons = []string{decide.ReasonNodeSilent, decide.ReasonKubeletUnhealthy, decide.ReasonAgentSilent}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "nodevigil", "remediator"
	m := &metrics{
		silentNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "silent_nodes",
			Help: "Nodes with at least one stale heartbeat (agent or kubelet Lease), by zone (\"unknown\" without a zone label).",
		}, []string{"zone"}),
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "nodes",
			Help: "Nodes by current verdict (the decision reason), e.g. AgentSilent counts nodes whose agent alone is broken: alert on it.",
		}, []string{"reason"}),
		unhealthyNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "unhealthy_nodes",
			Help: "Nodes counted against maxUnhealthy (judged unhealthy, toleration running or expired), by policy.",
		}, []string{"policy"}),
		zonePaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "zone_paused",
			Help: "1 while remediation in the zone is paused because too many of its nodes are silent.",
		}, []string{"zone"}),
		clusterPaused: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "cluster_paused",
			Help: "1 while all remediation is paused because too many nodes of the cluster are silent.",
		}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Changes of a node's decision, by the new decision's reason (a node staying healthy is not counted again).",
		}, []string{"outcome"}),
		terminations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "terminations_total",
			Help: "Instance termination requests by result; DryRun counts terminations dry-run mode would have requested.",
		}, []string{"result"}),
		blocked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "blocked_total",
			Help: "Remediation steps not taken, by the safety rail or obstacle that blocked them (counted when a node's block reason changes).",
		}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "in_flight",
			Help: "Nodes in the remediation pipeline (marked, cordoned, draining or terminating).",
		}),
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "is_leader",
			Help: "1 while this replica holds the leader Lease and acts.",
		}),
		detection: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "detection_latency_seconds",
			Help:    "Time from a heartbeat Lease's expiry to the decision that noticed it, by verdict.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60},
		}, []string{"reason"}),
		terminateLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "termination_latency_seconds",
			Help:    "Time from a node's toleration expiring to its first instance termination request (includes cordon and drain).",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800},
		}),
		blockedNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "blocked_nodes",
			Help: "Nodes recorded Blocked (nodevigil.io/remediation-blocked): remediation hit an obstacle retrying cannot fix (not owned, unauthorized, invalid provider ID, instance not found). They hold no in-flight slot; alert on it.",
		}, []string{"reason"}),
		cloudErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cloud_errors_total",
			Help: "Failed cloud calls of the pipeline by operation (Describe, Terminate) and kind (Throttled, ServerError, Timeout, Unauthorized, Other); all but Unauthorized are retried with backoff and jitter.",
		}, []string{"operation", "kind"}),
		drainingNodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "draining_nodes",
			Help: "Nodes in the Draining phase, waiting for evictions, PodDisruptionBudgets or do-not-disrupt pods; they count against maxInFlight.",
		}),
		firstReadyQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "first_ready_queued",
			Help: "Nodes this leader saw ready whose first-ready record (nodevigil.io/first-ready-at) the paced background writer has not written yet (--first-ready-rate). A change of leader loses them; see remediation/README.md for how the startup deadline is then judged.",
		}),
	}
	for _, c := range []prometheus.Collector{m.firstReadyQueued, m.silentNodes, m.nodes, m.unhealthyNodes, m.zonePaused, m.clusterPaused, m.decisions,
		m.terminations, m.blocked, m.inFlight, m.isLeader, m.detection, m.terminateLatency, m.blockedNodes, m.cloudErrors, m.drainingNodes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	// Pre-create the series with bounded labels so that rate() sees them from zero.
	for _, r := range decide.Reasons {
		m.decisions.WithLabelValues(r)
	}
	for _, r := range terminateResults {
		m.terminations.WithLabelValues(string(r))
	}
	for _, r := range blockReasons {
		m.blocked.WithLabelValues(r)
	}
	for _, r := range terminalBlocks {
		m.blockedNodes.WithLabelValues(r)
	}
	for _, op := range []string{"Describe", "Terminate"} {
		for _, k := range cloudErrorKinds {
			m.cloudErrors.WithLabelValues(op, k)
		}
	}
	return m, nil
}
