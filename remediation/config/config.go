// Package config loads and validates the remediator's policy file (apiVersion
// nodevigil.io/v1alpha1, kind RemediatorConfig) and resolves it into the Config the controller
// and the pure decision function read.
//
// The file is decoded strictly: an unknown or misspelt field, a value of the wrong shape, a
// duration that is not a Go duration or a percentage above 100% is an error naming the field by
// its path (policies[1].maxUnhealthy) and saying how to fix it. A remediator that silently
// ignored `maxUnhealty: 1` would run with a cap nobody chose; refusing to start is cheaper.
//
// Every field is optional and the defaults are conservative (see the Default* constants):
// dryRun is true unless the file says false, a pool stops being remediated when more than 20% of
// it is unhealthy, one node per pool is remediated at a time, and terminations are rate limited.
//
// Policies are matched in file order against the Node's labels and the first match wins. A node
// that matches no policy gets the built-in policy named "default" (every default below, action
// Terminate). To change what unmatched nodes get, end the list with a catch-all policy whose
// nodeSelector is empty ("" selects every node).
//
// Example:
//
//	apiVersion: nodevigil.io/v1alpha1
//	kind: RemediatorConfig
//	dryRun: false
//	agentNamespace: nodevigil-system
//	agentLeaseDuration: 40s
//	terminationRateLimit: {perMinute: 6, burst: 3}
//	zonePauseThreshold: 30%
//	clusterPauseThreshold: 20%
//	policies:
//	- name: kafka
//	  nodeSelector: karpenter.sh/nodepool=kafka
//	  action: CordonOnly
//	  maxUnhealthy: 1
//	- name: general
//	  nodeSelector: karpenter.sh/nodepool in (general,spot)
//	  action: Terminate
//	  tolerations:
//	    silentNode: 3m
//	    kubeletUnhealthy: 5m
//	    scheduledReboot: 20m
//	    conditions: {NetworkingReady: 10m, MemoryHealthy: 15m}
//	  startupGrace: 10m
//	  startupDeadline: 20m
//	  drain: {enabled: true, timeout: 10m, honorDoNotDisrupt: true, onTimeout: Proceed}
//	  maxUnhealthy: 20%
//	  maxInFlight: 2
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// APIVersion and Kind identify the file format, so that a file written for another program (or
// a future incompatible version) is rejected instead of half-applied.
const (
	APIVersion = "nodevigil.io/v1alpha1"
	Kind       = "RemediatorConfig"
)

// Action is what a policy lets the remediator do to a node judged dead.
type Action string

const (
	// ActionTerminate runs the whole pipeline: cordon, drain, terminate the EC2 instance,
	// delete the Node.
	ActionTerminate Action = "Terminate"
	// ActionCordonOnly cordons and taints the node and stops there, for pools (databases,
	// Kafka) whose owners want to take nodes away themselves.
	ActionCordonOnly Action = "CordonOnly"
	// ActionNone only reports: decisions are still made, logged, counted and evented.
	ActionNone Action = "None"
)

// OnTimeout says what happens when a drain has not finished within its timeout.
type OnTimeout string

const (
	// OnTimeoutProceed terminates the instance even though some pods could not be evicted
	// (a PodDisruptionBudget kept refusing). The node is already judged dead, so its pods are
	// not serving; waiting forever would only keep a dead machine.
	OnTimeoutProceed OnTimeout = "Proceed"
	// OnTimeoutWait keeps the node cordoned and keeps retrying evictions until they succeed,
	// the node recovers or an operator steps in.
	OnTimeoutWait OnTimeout = "Wait"
)

// Liveness says which heartbeats a policy needs before it may remediate.
type Liveness string

const (
	// LivenessTwoSignal (the default) remediates only on corroborated evidence: the agent's
	// Lease and the kubelet's Lease/Ready together. A node whose agent was never seen is never
	// remediated on the kubelet's word alone (only its startup deadline applies), and when no
	// agent Lease exists for any node the remediator reports a misconfiguration and remediates
	// nothing.
	LivenessTwoSignal Liveness = "TwoSignal"
	// LivenessSingleSignal also remediates nodes whose agent was never seen, on the kubelet's
	// signal alone, after tolerations.singleSignal (default 30m). It is for clusters that run
	// the remediator without agents on some pools, chosen explicitly.
	LivenessSingleSignal Liveness = "SingleSignal"
)

// DefaultPolicyName names the built-in policy applied to nodes that match no configured policy.
const DefaultPolicyName = "default"

// Defaults. They are conservative on purpose: a remediator that kills healthy nodes is worse
// than none, so every cap starts tight and the shipped mode is dry-run.
const (
	DefaultAgentNamespace     = "nodevigil-system"
	DefaultAgentLeaseDuration = 40 * time.Second
	DefaultSilentNode         = 3 * time.Minute
	DefaultKubeletUnhealthy   = 5 * time.Minute
	DefaultStartupGrace       = 10 * time.Minute
	DefaultStartupDeadline    = 20 * time.Minute
	DefaultDrainTimeout       = 10 * time.Minute
	DefaultMaxInFlight        = 1
	DefaultRatePerMinute      = 6.0
	DefaultRateBurst          = 3
	DefaultOnTimeout          = OnTimeoutProceed
	// DefaultScheduledRebootToleration is how long a node that goes silent inside the window of an AWS
	// scheduled reboot is tolerated (tolerations.scheduledReboot): an EC2 reboot or
	// system-maintenance takes the instance down for a few minutes, longer than silentNode.
	DefaultScheduledRebootToleration = 20 * time.Minute
	// DefaultSingleSignal is the kubelet-only toleration of liveness: SingleSignal, the
	// 30-minute class that single-signal repairers need because one heartbeat cannot tell a
	// dead machine from a partitioned or restarting one.
	DefaultSingleSignal = 30 * time.Minute
	// MinSingleSignal is the shortest single-signal toleration accepted.
	MinSingleSignal = 10 * time.Minute
	// DefaultStartupTaint is the readiness taint the agent removes once the node is really
	// ready; still carrying it at the startup deadline means the node never became ready.
	DefaultStartupTaint = "readiness.k8s.io/nodevigil-agent-not-ready"
	// DefaultPoolLabel is Karpenter's NodePool label: the pool a node was launched for.
	DefaultPoolLabel = "karpenter.sh/nodepool"
)

// Default thresholds, as the strings a user would write.
var (
	DefaultMaxUnhealthy          = intstr.FromString("20%")
	DefaultZonePauseThreshold    = intstr.FromString("30%")
	DefaultClusterPauseThreshold = intstr.FromString("20%")
)

// RemediatorConfig is the file as written by the user. Pointers tell "not set" (take the
// default) apart from an explicit zero. Use Parse or Load to get a validated Config.
type RemediatorConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// DryRun decides and reports but changes nothing. Unset means true: acting must be chosen.
	DryRun *bool `json:"dryRun,omitempty"`
	// AgentNamespace is where the agents' heartbeat Leases live.
	AgentNamespace string `json:"agentNamespace,omitempty"`
	// AgentLeaseDuration is used for agent Leases that do not state their own duration, and as
	// the observe period of a newly elected leader.
	AgentLeaseDuration *metav1.Duration `json:"agentLeaseDuration,omitempty"`
	// TerminationRateLimit bounds how fast instances are terminated, cluster-wide.
	TerminationRateLimit *RateLimitSpec `json:"terminationRateLimit,omitempty"`
	// ZonePauseThreshold pauses every remediation in a zone when more than this many (count or
	// percent of the zone's nodes, rounded up) are silent.
	ZonePauseThreshold *intstr.IntOrString `json:"zonePauseThreshold,omitempty"`
	// ClusterPauseThreshold is the same for the whole cluster.
	ClusterPauseThreshold *intstr.IntOrString `json:"clusterPauseThreshold,omitempty"`
	// PoolLabel is the Node label whose value names a node's pool: maxUnhealthy and
	// maxInFlight count per distinct (policy, value), so one policy that spans many pools
	// cannot let one pool's trouble use up another's budget. Nodes without the label count
	// under the policy alone. Default karpenter.sh/nodepool.
	PoolLabel string `json:"poolLabel,omitempty"`
	// NodeSelector is the label selector of the Nodes this remediator looks after; "" (the
	// default) is every node. Nodes outside it are not watched: never judged, counted in the
	// storm census or touched. It is for nodes another system owns — EKS Fargate's virtual
	// nodes (eks.amazonaws.com/compute-type!=fargate), which have neither an EC2 instance nor
	// an agent, Windows nodes without the agent, or pools a second remediator runs — so that
	// they neither need a policy of their own nor skew the pauses. A node whose labels change so
	// that it leaves the selector is forgotten where it stands: a cordon or remediation record
	// this remediator wrote stays for an operator to clear.
	NodeSelector string `json:"nodeSelector,omitempty"`
	// Policies are matched in order; the first whose nodeSelector matches a node applies.
	Policies []PolicySpec `json:"policies,omitempty"`
}

// RateLimitSpec is a token bucket: PerMinute tokens refill per minute, up to Burst.
type RateLimitSpec struct {
	PerMinute *float64 `json:"perMinute,omitempty"`
	Burst     *int32   `json:"burst,omitempty"`
}

// PolicySpec is one per-pool policy as written in the file.
type PolicySpec struct {
	// Name identifies the policy in Events, logs and metric labels; a DNS label.
	Name string `json:"name"`
	// NodeSelector is a label selector (karpenter.sh/nodepool=kafka, "pool in (a,b)"); ""
	// selects every node.
	NodeSelector string `json:"nodeSelector"`
	// Action is Terminate (default), CordonOnly or None.
	Action Action `json:"action,omitempty"`
	// Liveness is TwoSignal (default) or SingleSignal; see LivenessSingleSignal.
	Liveness Liveness `json:"liveness,omitempty"`
	// Tolerations say how long each kind of ill health is tolerated.
	Tolerations *TolerationsSpec `json:"tolerations,omitempty"`
	// StartupGrace protects a new node from every remediation but the startup deadline, so a
	// kubelet restarting during bootstrap never gets its node replaced. Default 10m.
	StartupGrace *metav1.Duration `json:"startupGrace,omitempty"`
	// StartupDeadline is when a node whose agent was never seen, or that still carries one of
	// StartupTaints, is replaced (measured from the Node's creation). Default 20m.
	StartupDeadline *metav1.Duration `json:"startupDeadline,omitempty"`
	// StartupTaints are the taint keys a ready node has shed (the agent removes its own).
	// Default [readiness.k8s.io/nodevigil-agent-not-ready]; [] checks none.
	StartupTaints []string `json:"startupTaints,omitempty"`
	// Drain configures the eviction of the node's pods before termination.
	Drain *DrainSpec `json:"drain,omitempty"`
	// MaxUnhealthy pauses the pool when more of its nodes than this (count, or percent
	// rounded up like a PDB's maxUnavailable) are unhealthy at once. Default 20%.
	MaxUnhealthy *intstr.IntOrString `json:"maxUnhealthy,omitempty"`
	// MaxInFlight is how many of the pool's nodes may be in the pipeline at once. Default 1.
	MaxInFlight *int32 `json:"maxInFlight,omitempty"`
	// Interruptions says what AWS-initiated events mean for this pool (interruptions.go).
	Interruptions *InterruptionsSpec `json:"interruptions,omitempty"`
}

// TolerationsSpec says how long each kind of unhealthiness is tolerated before remediation.
type TolerationsSpec struct {
	// SilentNode runs from the moment both the agent's and the kubelet's Leases have expired.
	// Default 3m: two independent heartbeats corroborate each other.
	SilentNode *metav1.Duration `json:"silentNode,omitempty"`
	// KubeletUnhealthy runs while the agent is alive but the kubelet is not: its Lease is
	// stale as observed by the remediator, or Ready is False after the node first became
	// ready. The agent's own KubeletHealthy condition never starts it. Default 5m.
	KubeletUnhealthy *metav1.Duration `json:"kubeletUnhealthy,omitempty"`
	// ScheduledReboot replaces the silentNode and kubeletUnhealthy tolerations, when it is the
	// longer, for a node whose silence began inside the window of one of its instance's
	// scheduled reboots (EC2 events instance-reboot, system-reboot, system-maintenance, from
	// the agent's NoScheduledEvent condition or DescribeInstanceStatus): AWS is rebooting it,
	// and it comes back within minutes. Default 20m; at least silentNode (equal to it gives
	// scheduled reboots no extra time).
	ScheduledReboot *metav1.Duration `json:"scheduledReboot,omitempty"`
	// SingleSignal runs, under liveness: SingleSignal only, while a node whose agent was never
	// seen has a stale kubelet (or Ready not True) after it first became ready. Default 30m,
	// at least 10m.
	SingleSignal *metav1.Duration `json:"singleSignal,omitempty"`
	// Conditions maps positive-polarity Node condition types (NetworkingReady, MemoryHealthy,
	// KubeletHealthy, …) to how long they may be False while the agent is alive, measured from
	// their LastTransitionTime. An agent condition counts only when listed here. Default none.
	Conditions map[string]metav1.Duration `json:"conditions,omitempty"`
}

// DrainSpec configures the drain step.
type DrainSpec struct {
	// Enabled evicts the pods before terminating. Default true.
	Enabled *bool `json:"enabled,omitempty"`
	// Timeout bounds the drain, from its start: refused evictions and do-not-disrupt pods
	// included. Default 10m.
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// HonorDoNotDisrupt leaves pods annotated karpenter.sh/do-not-disrupt=true alone: they are
	// not evicted and hold the drain until they leave or the drain timeout passes; then
	// OnTimeout decides. Default true.
	HonorDoNotDisrupt *bool `json:"honorDoNotDisrupt,omitempty"`
	// OnTimeout is Proceed (default: terminate anyway, do-not-disrupt pods included) or Wait
	// (keep retrying; the node keeps its in-flight slot).
	OnTimeout OnTimeout `json:"onTimeout,omitempty"`
}

// Config is the resolved, validated configuration: every default filled, selectors parsed.
// The last policy is always the built-in default, so PolicyFor never returns nil.
type Config struct {
	DryRun                bool
	AgentNamespace        string
	AgentLeaseDuration    time.Duration
	TerminationRateLimit  RateLimit
	ZonePauseThreshold    intstr.IntOrString
	ClusterPauseThreshold intstr.IntOrString
	// PoolLabel is the label whose value splits a policy's nodes into pools for the caps.
	PoolLabel string
	// NodeSelector is the remediator's scope in canonical form ("" every node), for the Node
	// informer's list and watch; Scope is it parsed, for readers that filter nodes themselves.
	NodeSelector string
	Scope        labels.Selector
	Policies     []Policy
}

// RateLimit is the resolved termination rate limit.
type RateLimit struct {
	PerMinute float64
	Burst     int
}

// Policy is one resolved per-pool policy; the decision function and the pipeline read it.
type Policy struct {
	Name string
	// NodeSelector is the selector as written, kept for messages.
	NodeSelector string
	// Selector is NodeSelector parsed.
	Selector        labels.Selector
	Action          Action
	Liveness        Liveness
	Tolerations     Tolerations
	StartupGrace    time.Duration
	StartupDeadline time.Duration
	// StartupTaints are taint keys a node must have shed by its startup deadline.
	StartupTaints []string
	Drain         Drain
	MaxUnhealthy  intstr.IntOrString
	MaxInFlight   int
	// Interruptions is the resolved interruptions block (defaults when absent).
	Interruptions Interruptions
}

// Tolerations is the resolved form of TolerationsSpec.
type Tolerations struct {
	SilentNode       time.Duration
	KubeletUnhealthy time.Duration
	// ScheduledReboot is the toleration of a silence that began inside a scheduled reboot's
	// window, used when longer than the toleration that would apply otherwise.
	ScheduledReboot time.Duration
	// SingleSignal is used only when the policy's Liveness is SingleSignal.
	SingleSignal time.Duration
	// Conditions maps a positive-polarity Node condition type to how long it may be False.
	Conditions map[string]time.Duration
}

// Drain is the resolved form of DrainSpec.
type Drain struct {
	Enabled           bool
	Timeout           time.Duration
	HonorDoNotDisrupt bool
	OnTimeout         OnTimeout
}

// PolicyFor returns the first policy whose selector matches the node's labels, or the built-in
// default policy.
func (c *Config) PolicyFor(nodeLabels map[string]string) *Policy {
	set := labels.Set(nodeLabels)
	for i := range c.Policies {
		if c.Policies[i].Selector.Matches(set) {
			return &c.Policies[i]
		}
	}
	// Unreachable for a Config built by this package: the default policy matches everything.
	return &c.Policies[len(c.Policies)-1]
}

// PoolOf returns the key the caps of policy p count node under: the policy name, and the value
// of PoolLabel when the node carries it ("general/spot-a"), so that maxUnhealthy and
// maxInFlight hold per pool even when one policy selects several pools.
func (c *Config) PoolOf(p *Policy, nodeLabels map[string]string) string {
	if c.PoolLabel != "" {
		if v := nodeLabels[c.PoolLabel]; v != "" {
			return p.Name + "/" + v
		}
	}
	return p.Name
}

// AllowedUnhealthy returns how many of total nodes may be unhealthy before the pool is paused,
// rounding a percentage up like a PodDisruptionBudget's maxUnavailable (20% of 3 nodes is 1).
func (p *Policy) AllowedUnhealthy(total int) int {
	return scaled(p.MaxUnhealthy, total)
}

// PauseAllowed returns how many of total nodes may be silent before threshold pauses
// remediation, rounded up.
func PauseAllowed(threshold intstr.IntOrString, total int) int {
	return scaled(threshold, total)
}

func scaled(v intstr.IntOrString, total int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, total, true)
	if err != nil {
		// Validated at load time; an unparsable value allows nothing, the safe side.
		return 0
	}
	return n
}

// Default returns the built-in configuration: dry-run, one default policy.
func Default() *Config {
	c, err := resolve(&RemediatorConfig{APIVersion: APIVersion, Kind: Kind})
	if err != nil {
		// The defaults are constants validated by the tests; this cannot fail.
		return nil
	}
	return c
}

// Load reads and validates the file at path. An empty path means no file: the built-in
// defaults. A path that cannot be read is an error, so a typo in --config does not silently
// fall back to defaults.
func Load(path string) (*Config, error) {
	if path == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse strictly decodes and validates a RemediatorConfig document. All problems are reported
// at once, one per line, each naming its field path.
func Parse(data []byte) (*Config, error) {
	doc, err := Decode(data)
	if err != nil {
		return nil, err
	}
	return resolve(doc)
}

// Decode strictly decodes a document without resolving defaults: unknown fields, duplicated
// keys and values of the wrong shape are errors naming their path.
func Decode(data []byte) (*RemediatorConfig, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	var raw any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	if raw == nil {
		return nil, errors.New("empty document; start it with apiVersion: " + APIVersion + " and kind: " + Kind)
	}
	var errs []error
	checkShape("", raw, typeOfRemediatorConfig, &errs)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	doc := &RemediatorConfig{}
	strict := json.NewDecoder(bytes.NewReader(js))
	strict.DisallowUnknownFields()
	if err := strict.Decode(doc); err != nil {
		// checkShape accepts only what decodes; reaching here is a bug in checkShape.
		return nil, fmt.Errorf("decode: %w", err)
	}
	return doc, nil
}
