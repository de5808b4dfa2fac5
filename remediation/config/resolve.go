package config

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// negativePolarity are the kubelet's condition types where True means unhealthy. nodevigil
// acts on conditions that are False, so listing one of these would invert its meaning.
var negativePolarity = []string{"MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"}

// resolve validates doc and fills every default. Errors are collected, not returned at the
// first, so a user fixes the file in one pass.
func resolve(doc *RemediatorConfig) (*Config, error) {
	var errs []error
	fail := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}

	if doc.APIVersion != APIVersion {
		fail("apiVersion", "%q is not supported; set apiVersion: %s", doc.APIVersion, APIVersion)
	}
	if doc.Kind != Kind {
		fail("kind", "%q is not supported; set kind: %s", doc.Kind, Kind)
	}

	c := &Config{
		DryRun:                true,
		AgentNamespace:        DefaultAgentNamespace,
		AgentLeaseDuration:    DefaultAgentLeaseDuration,
		TerminationRateLimit:  RateLimit{PerMinute: DefaultRatePerMinute, Burst: DefaultRateBurst},
		ZonePauseThreshold:    DefaultZonePauseThreshold,
		ClusterPauseThreshold: DefaultClusterPauseThreshold,
		PoolLabel:             DefaultPoolLabel,
	}
	if doc.PoolLabel != "" {
		if msgs := validation.IsQualifiedName(doc.PoolLabel); len(msgs) > 0 {
			fail("poolLabel", "%q is not a label key: %s; e.g. karpenter.sh/nodepool or eks.amazonaws.com/nodegroup", doc.PoolLabel, strings.Join(msgs, "; "))
		}
		c.PoolLabel = doc.PoolLabel
	}
	c.Scope = labels.Everything()
	if doc.NodeSelector != "" {
		sel, err := labels.Parse(doc.NodeSelector)
		if err != nil {
			fail("nodeSelector", "%q is not a label selector (%v); write e.g. eks.amazonaws.com/compute-type!=fargate, or \"\" for every node", doc.NodeSelector, err)
		} else {
			c.Scope, c.NodeSelector = sel, sel.String()
		}
	}
	if doc.DryRun != nil {
		c.DryRun = *doc.DryRun
	}
	if doc.AgentNamespace != "" {
		if msgs := validation.IsDNS1123Label(doc.AgentNamespace); len(msgs) > 0 {
			fail("agentNamespace", "%q is not a namespace name: %s", doc.AgentNamespace, strings.Join(msgs, "; "))
		}
		c.AgentNamespace = doc.AgentNamespace
	}
	if d := doc.AgentLeaseDuration; d != nil {
		if d.Duration < time.Second {
			fail("agentLeaseDuration", "%s is too short; use the agent's lease duration (default %s), at least 1s", d.Duration, DefaultAgentLeaseDuration)
		}
		c.AgentLeaseDuration = d.Duration
	}
	if rl := doc.TerminationRateLimit; rl != nil {
		if rl.PerMinute != nil {
			if v := *rl.PerMinute; v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
				fail("terminationRateLimit.perMinute", "%v must be above 0 (e.g. 6 for one termination every 10s on average); use dryRun or action: None to stop terminations", v)
			}
			c.TerminationRateLimit.PerMinute = *rl.PerMinute
		}
		if rl.Burst != nil {
			if *rl.Burst < 1 {
				fail("terminationRateLimit.burst", "%d must be at least 1", *rl.Burst)
			}
			c.TerminationRateLimit.Burst = int(*rl.Burst)
		}
	}
	if t := doc.ZonePauseThreshold; t != nil {
		checkThreshold("zonePauseThreshold", *t, fail)
		c.ZonePauseThreshold = *t
	}
	if t := doc.ClusterPauseThreshold; t != nil {
		checkThreshold("clusterPauseThreshold", *t, fail)
		c.ClusterPauseThreshold = *t
	}

	seen := map[string]int{}
	for i := range doc.Policies {
		path := fmt.Sprintf("policies[%d]", i)
		p := resolvePolicy(path, &doc.Policies[i], fail)
		if p.Name != "" {
			if j, dup := seen[p.Name]; dup {
				fail(path+".name", "%q is already the name of policies[%d]; names must be unique", p.Name, j)
			}
			seen[p.Name] = i
		}
		c.Policies = append(c.Policies, p)
	}
	def := resolvePolicy("default policy", &PolicySpec{Name: DefaultPolicyName}, fail)
	c.Policies = append(c.Policies, def)

	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

func resolvePolicy(path string, s *PolicySpec, fail func(path, format string, args ...any)) Policy {
	p := Policy{
		Name:         s.Name,
		NodeSelector: s.NodeSelector,
		Action:       ActionTerminate,
		Liveness:     LivenessTwoSignal,
		Tolerations: Tolerations{
			SilentNode:       DefaultSilentNode,
			KubeletUnhealthy: DefaultKubeletUnhealthy,
			ScheduledReboot:  DefaultScheduledRebootToleration,
			SingleSignal:     DefaultSingleSignal,
			Conditions:       map[string]time.Duration{},
		},
		StartupGrace:    DefaultStartupGrace,
		StartupDeadline: DefaultStartupDeadline,
		StartupTaints:   []string{DefaultStartupTaint},
		Drain: Drain{
			Enabled:           true,
			Timeout:           DefaultDrainTimeout,
			HonorDoNotDisrupt: true,
			OnTimeout:         DefaultOnTimeout,
		},
		MaxUnhealthy: DefaultMaxUnhealthy,
		MaxInFlight:  DefaultMaxInFlight,
	}

	// The name is a metric label and appears in Events, so it must be short and tame.
	switch {
	case s.Name == "":
		fail(path+".name", "missing; give every policy a short name such as the node pool it covers")
	case s.Name == DefaultPolicyName && path != "default policy":
		fail(path+".name", "%q is reserved for the built-in fallback policy; pick another name (a last policy with nodeSelector \"\" replaces the fallback)", s.Name)
	default:
		if msgs := validation.IsDNS1123Label(s.Name); len(msgs) > 0 {
			fail(path+".name", "%q is not a valid name (lower-case letters, digits and '-', at most 63): %s", s.Name, strings.Join(msgs, "; "))
		}
	}

	sel, err := labels.Parse(s.NodeSelector)
	if err != nil {
		fail(path+".nodeSelector", "%q is not a label selector (%v); write e.g. karpenter.sh/nodepool=kafka", s.NodeSelector, err)
		sel = labels.Nothing()
	}
	p.Selector = sel

	switch s.Action {
	case "":
	case ActionTerminate, ActionCordonOnly, ActionNone:
		p.Action = s.Action
	default:
		fail(path+".action", "%q is not an action; use Terminate, CordonOnly or None", s.Action)
	}

	switch s.Liveness {
	case "":
	case LivenessTwoSignal, LivenessSingleSignal:
		p.Liveness = s.Liveness
	default:
		fail(path+".liveness", "%q is not a liveness mode; use TwoSignal (default: agent and kubelet heartbeats together) or SingleSignal (also remediate nodes without an agent on the kubelet alone, after tolerations.singleSignal)", s.Liveness)
	}

	if t := s.Tolerations; t != nil {
		if t.SingleSignal != nil {
			switch d := t.SingleSignal.Duration; {
			case p.Liveness != LivenessSingleSignal:
				fail(path+".tolerations.singleSignal", "is only used with liveness: SingleSignal; remove it or set liveness: SingleSignal")
			case d < MinSingleSignal:
				fail(path+".tolerations.singleSignal", "%s is too short for remediating on one signal (a restarting or partitioned kubelet looks the same); use at least %s (default %s)", d, MinSingleSignal, DefaultSingleSignal)
			default:
				p.Tolerations.SingleSignal = d
			}
		}
		if t.SilentNode != nil {
			p.Tolerations.SilentNode = nonNegative(path+".tolerations.silentNode", t.SilentNode, fail)
		}
		if t.KubeletUnhealthy != nil {
			p.Tolerations.KubeletUnhealthy = nonNegative(path+".tolerations.kubeletUnhealthy", t.KubeletUnhealthy, fail)
		}
		if t.ScheduledReboot != nil {
			// Below silentNode it would never extend anything: a value that silently does
			// nothing is refused. The default is not checked: a policy with a silentNode above
			// 20m simply gets no extension, as before the field existed.
			if d, silent := t.ScheduledReboot.Duration, p.Tolerations.SilentNode; d < silent {
				fail(path+".tolerations.scheduledReboot", "%s is shorter than tolerations.silentNode %s, so it would never extend the toleration of a node AWS is rebooting; use at least %s (default %s; equal to silentNode gives scheduled reboots no extra time)", d, silent, silent, DefaultScheduledRebootToleration)
			} else {
				p.Tolerations.ScheduledReboot = d
			}
		}
		keys := make([]string, 0, len(t.Conditions))
		for k := range t.Conditions {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			cpath := path + ".tolerations.conditions." + k
			d := t.Conditions[k]
			switch {
			case slices.Contains(negativePolarity, k):
				fail(cpath, "%s has negative polarity (True means unhealthy); nodevigil acts on positive-polarity conditions that are False, such as NetworkingReady or MemoryHealthy", k)
			default:
				if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
					fail(cpath, "%q is not a condition type: %s", k, strings.Join(msgs, "; "))
				}
			}
			p.Tolerations.Conditions[k] = nonNegative(cpath, &d, fail)
		}
	}

	if s.StartupGrace != nil {
		p.StartupGrace = nonNegative(path+".startupGrace", s.StartupGrace, fail)
	}
	if s.StartupDeadline != nil {
		p.StartupDeadline = nonNegative(path+".startupDeadline", s.StartupDeadline, fail)
	}
	if p.StartupDeadline < p.StartupGrace {
		fail(path+".startupDeadline", "%s is shorter than startupGrace %s; the deadline must be at least the grace", p.StartupDeadline, p.StartupGrace)
	}
	if s.StartupTaints != nil {
		p.StartupTaints = nil
		for i, k := range s.StartupTaints {
			if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
				fail(fmt.Sprintf("%s.startupTaints[%d]", path, i), "%q is not a taint key (write the key only, without value or effect): %s", k, strings.Join(msgs, "; "))
			}
			p.StartupTaints = append(p.StartupTaints, k)
		}
	}

	if d := s.Drain; d != nil {
		if d.Enabled != nil {
			p.Drain.Enabled = *d.Enabled
		}
		if d.Timeout != nil {
			if d.Timeout.Duration <= 0 {
				fail(path+".drain.timeout", "%s must be above 0; set drain.enabled: false to skip draining", d.Timeout.Duration)
			}
			p.Drain.Timeout = d.Timeout.Duration
		}
		if d.HonorDoNotDisrupt != nil {
			p.Drain.HonorDoNotDisrupt = *d.HonorDoNotDisrupt
		}
		switch d.OnTimeout {
		case "":
		case OnTimeoutProceed, OnTimeoutWait:
			p.Drain.OnTimeout = d.OnTimeout
		default:
			fail(path+".drain.onTimeout", "%q is not a choice; use Proceed or Wait", d.OnTimeout)
		}
	}

	if m := s.MaxUnhealthy; m != nil {
		checkCap(path+".maxUnhealthy", *m, "use action: None to stop remediating the pool", fail)
		p.MaxUnhealthy = *m
	}
	if m := s.MaxInFlight; m != nil {
		if *m < 1 {
			fail(path+".maxInFlight", "%d must be at least 1; use action: None to stop remediating the pool", *m)
		}
		p.MaxInFlight = int(*m)
	}
	p.Interruptions = resolveInterruptions(path+".interruptions", s.Interruptions, fail)
	return p
}

func nonNegative(path string, d *metav1.Duration, fail func(path, format string, args ...any)) time.Duration {
	if d.Duration < 0 {
		fail(path, "%s is negative; write a duration of 0s or more", d.Duration)
		return 0
	}
	return d.Duration
}

// checkThreshold validates a pause threshold: a count of at least 1 or a percentage in (0,100].
func checkThreshold(path string, v intstr.IntOrString, fail func(path, format string, args ...any)) {
	checkCap(path, v, "a threshold of 0 would pause on the first silent node", fail)
}

func checkCap(path string, v intstr.IntOrString, zeroHint string, fail func(path, format string, args ...any)) {
	if v.Type == intstr.Int {
		if v.IntVal < 1 {
			fail(path, "%d must be at least 1; %s", v.IntVal, zeroHint)
		}
		return
	}
	n, err := strconv.Atoi(strings.TrimSuffix(v.StrVal, "%"))
	switch {
	case !strings.HasSuffix(v.StrVal, "%") || err != nil:
		fail(path, "%q is neither a count nor a percentage; write e.g. 2 or \"20%%\"", v.StrVal)
	case n > 100:
		fail(path, "%q is above 100%%; use a percentage between 1%% and 100%% or a node count", v.StrVal)
	case n < 1:
		fail(path, "%q must be at least 1%%; %s", v.StrVal, zeroHint)
	}
}
