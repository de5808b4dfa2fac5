package fleet

import (
	"fmt"
	"time"
)

// Timings are the remediator's tolerations for the fleet's two pools. They are short so that
// a user watching `make run` (or a scenario test) sees each fault handled in a minute or two.
type Timings struct {
	SilentNode       time.Duration
	KubeletUnhealthy time.Duration
	NetworkingReady  time.Duration
	StartupGrace     time.Duration
	StartupDeadline  time.Duration
	DrainTimeout     time.Duration
}

// DevTimings are `make run`'s.
var DevTimings = Timings{
	SilentNode:       30 * time.Second,
	KubeletUnhealthy: 45 * time.Second,
	NetworkingReady:  60 * time.Second,
	StartupGrace:     20 * time.Second,
	StartupDeadline:  3 * time.Minute,
	DrainTimeout:     30 * time.Second,
}

// RemediatorConfig renders the RemediatorConfig for the fleet's pools: `general` is
// Terminate (drain, then terminate even past the drain timeout) and acts on AWS's events with
// the defaults, `kafka` is CordonOnly with a drain that honours karpenter.sh/do-not-disrupt and
// waits, and only reports AWS's events (Notify); every other node (the developer's
// own machine in `make run`) falls to a policy that only reports. Pools are told apart by
// poolLabel, zones by topology.kubernetes.io/zone. A fleet with an ID of its own (a scenario
// sharing its cluster with others) is scoped to its two pools, so its remediator never judges
// or counts another fleet's nodes.
func RemediatorConfig(cfg Config, t Timings) string {
	general, kafka := "general", "kafka"
	scope := ""
	if cfg.ID != "" && cfg.ID != "fleet" {
		general, kafka = cfg.ID+"-general", cfg.ID+"-kafka"
		scope = fmt.Sprintf("%s in (%s,%s)", poolLabelOr(cfg.PoolLabel), general, kafka)
	}
	return fmt.Sprintf(`apiVersion: nodevigil.io/v1alpha1
kind: RemediatorConfig
dryRun: false
nodeSelector: %[13]q
agentNamespace: %[1]s
agentLeaseDuration: %[2]s
terminationRateLimit:
  perMinute: 30
  burst: 4
zonePauseThreshold: 50%%
clusterPauseThreshold: 50%%
poolLabel: %[3]s
policies:
- name: general
  nodeSelector: %[3]s=%[4]s
  action: Terminate
  tolerations:
    silentNode: %[6]s
    kubeletUnhealthy: %[7]s
    conditions:
      NetworkingReady: %[8]s
  startupGrace: %[9]s
  startupDeadline: %[10]s
  startupTaints: [%[12]s]
  drain:
    timeout: %[11]s
    onTimeout: Proceed
  maxUnhealthy: 40%%
  maxInFlight: 2
  interruptions:             # the defaults, spelled out
    spotInterruption: Drain
    rebalanceRecommendation: Notify
    scheduledReboot: CordonOnly
    scheduledRetirement: Drain
    asgTermination: Drain
- name: kafka
  nodeSelector: %[3]s=%[5]s
  action: CordonOnly
  tolerations:
    silentNode: %[6]s
    kubeletUnhealthy: %[7]s
  startupGrace: %[9]s
  startupDeadline: %[10]s
  startupTaints: [%[12]s]
  drain:
    timeout: %[11]s
    honorDoNotDisrupt: true
    onTimeout: Wait
  maxUnhealthy: 1
  maxInFlight: 1
  interruptions:             # brokers move on their own schedule: AWS events are only reported
    spotInterruption: Notify
    rebalanceRecommendation: Notify
    scheduledReboot: Notify
    scheduledRetirement: Notify
    asgTermination: Notify
- name: others
  nodeSelector: ""
  action: None
`, cfg.AgentNamespace, cfg.AgentLeaseDuration, poolLabelOr(cfg.PoolLabel), general, kafka,
		t.SilentNode, t.KubeletUnhealthy, t.NetworkingReady, t.StartupGrace, t.StartupDeadline, t.DrainTimeout, StartupTaint, scope)
}

func poolLabelOr(l string) string {
	if l == "" {
		return DefaultPoolLabel
	}
	return l
}

// DefaultPools is `make run`'s fleet: twelve nodes over three zones, four of them with a
// real agent (two per pool); general runs on spot instances, kafka on demand.
func DefaultPools(id string) []PoolSpec {
	general, kafka := "general", "kafka"
	if id != "" && id != "fleet" {
		general, kafka = id+"-general", id+"-kafka"
	}
	return []PoolSpec{
		{Name: general, Size: 8, RealAgents: 2, Spot: true},
		{Name: kafka, Size: 4, RealAgents: 2, DoNotDisrupt: true},
	}
}
