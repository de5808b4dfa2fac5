package ec2emu

import (
	"fmt"
	"io"
	"regexp"
	"sort"

	"sigs.k8s.io/yaml"
)

// Instance states, as EC2 names them in instanceState/name. The emulator only moves instances
// along running → shutting-down → terminated; the other states exist so tests can seed
// instances that are not running (a stopped instance is still terminable).
const (
	StatePending      = "pending"
	StateRunning      = "running"
	StateShuttingDown = "shutting-down"
	StateTerminated   = "terminated"
	StateStopping     = "stopping"
	StateStopped      = "stopped"
)

// LifecycleSpot is the instanceLifecycle of a spot instance.
const LifecycleSpot = "spot"

// stateCodes are the numeric codes EC2 reports beside each state name (the low byte of
// instanceState/code).
var stateCodes = map[string]int{
	StatePending:      0,
	StateRunning:      16,
	StateShuttingDown: 32,
	StateTerminated:   48,
	StateStopping:     64,
	StateStopped:      80,
}

// instanceIDPattern is the form EC2 gives instance IDs: "i-" and 8 (older) or 17 lower-case
// hexadecimal digits. Anything else is answered with InvalidInstanceID.Malformed.
var instanceIDPattern = regexp.MustCompile(`^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$`)

// Instance is one emulated EC2 instance. It carries only what nodevigil reads: the ID, the
// state, the Availability Zone and the tags (ownership is decided by a cluster tag). The JSON
// names are the ones accepted in a seed file (see LoadInstances).
type Instance struct {
	// ID is the instance ID, e.g. "i-0123456789abcdef0".
	ID string `json:"id"`
	// Zone is the Availability Zone; empty means Config.DefaultZone.
	Zone string `json:"zone,omitempty"`
	// State is the instance state name; empty means "running". When read back through
	// Server.Instance it is the current state, moved along by terminations and the clock.
	State string `json:"state,omitempty"`
	// Tags are the instance's tags, e.g. {"kubernetes.io/cluster/prod": "owned"}. An instance
	// launched by an Auto Scaling group carries aws:autoscaling:groupName.
	Tags map[string]string `json:"tags,omitempty"`
	// Lifecycle is DescribeInstances' instanceLifecycle: "spot" for a spot instance, empty for
	// on-demand (EC2 omits the element then), or "scheduled" / "capacity-block".
	Lifecycle string `json:"lifecycle,omitempty"`
}

// Validate reports what is wrong with an instance before it is added, so that a bad seed file
// fails loudly instead of producing an emulator that answers Malformed for its own instances.
func (in Instance) Validate() error {
	if !instanceIDPattern.MatchString(in.ID) {
		return fmt.Errorf("instance id %q: want \"i-\" followed by 8 or 17 lower-case hex digits", in.ID)
	}
	switch in.Lifecycle {
	case "", LifecycleSpot, "scheduled", "capacity-block":
	default:
		return fmt.Errorf("instance %s: lifecycle %q is not spot, scheduled, capacity-block or empty (on-demand)", in.ID, in.Lifecycle)
	}
	if in.State != "" {
		if _, ok := stateCodes[in.State]; !ok {
			return fmt.Errorf("instance %s: state %q is not one of %s", in.ID, in.State, stateNames())
		}
	}
	return nil
}

func stateNames() []string {
	names := make([]string, 0, len(stateCodes))
	for n := range stateCodes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// seedFile is the document LoadInstances reads.
type seedFile struct {
	Instances []Instance `json:"instances"`
}

// LoadInstances reads a seed document, YAML or JSON, of the form
//
//	instances:
//	- id: i-0123456789abcdef0
//	  zone: us-east-1a
//	  state: running
//	  tags: {kubernetes.io/cluster/dev: owned}
//
// It exists so the standalone emulator binary and end-to-end tests can describe a fleet in a
// fixture file. Unknown fields and invalid instances are errors that name the instance.
func LoadInstances(r io.Reader) ([]Instance, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read instances: %w", err)
	}
	var doc seedFile
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("parse instances: %w", err)
	}
	seen := make(map[string]bool, len(doc.Instances))
	for i, in := range doc.Instances {
		if err := in.Validate(); err != nil {
			return nil, fmt.Errorf("instances[%d]: %w", i, err)
		}
		if seen[in.ID] {
			return nil, fmt.Errorf("instances[%d]: duplicate instance id %s", i, in.ID)
		}
		seen[in.ID] = true
	}
	return doc.Instances, nil
}
