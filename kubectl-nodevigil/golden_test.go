package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodevigil/nodevigil/integration/fleetfixture"
	"github.com/nodevigil/nodevigil/remediation/config"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// goldenNow is the fixed moment the unit golden files are told at.
// goldenNodes are the nodes explain is told for: every node of the fleet.
var goldenNodes = []string{"general-a-1", "general-a-2", "general-a-3", "general-b-1", "general-b-2", "general-c-1", "general-c-2", "general-c-3", "kafka-a-1", "kafka-b-1"}

var goldenNow = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// goldenSnapshot is the fleet of testdata/fleet.yaml rendered at goldenNow, with the Events
// of every node.
func goldenSnapshot(t *testing.T) (*snapshot, map[string][]corev1.Event) {
	t.Helper()
	objs, err := fleetfixture.Render(filepath.Join("testdata", "fleet.yaml"), goldenNow)
	if err != nil {
		t.Fatal(err)
	}
	s := &snapshot{now: goldenNow, kubelet: map[string]*coordinationv1.Lease{}, agent: map[string]*coordinationv1.Lease{}}
	events := map[string][]corev1.Event{}
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ConfigMap:
			if s.cfg, err = config.Parse([]byte(o.Data[configMapKey])); err != nil {
				t.Fatalf("fleet config: %v", err)
			}
			s.cfgSource = "configmap " + o.Namespace + "/" + o.Name
		case *corev1.Node:
			s.nodes = append(s.nodes, *o)
		case *coordinationv1.Lease:
			if o.Namespace == kubeletLeaseNamespace {
				s.kubelet[o.Name] = o
			} else {
				s.agent[o.Labels[agentLeaseLabel]] = o
			}
		case *corev1.Event:
			events[o.InvolvedObject.Name] = append(events[o.InvolvedObject.Name], *o)
		default:
			t.Fatalf("fleet holds a %T", o)
		}
	}
	if s.cfg == nil {
		t.Fatal("fleet has no remediator ConfigMap")
	}
	return s, events
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./kubectl-nodevigil -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s (go test ./kubectl-nodevigil -update rewrites it)\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

func TestStatusGolden(t *testing.T) {
	for _, tc := range []struct{ name, output string }{
		{"status", ""},
		{"status-wide", "wide"},
		{"status-json", "json"},
		{"status-yaml", "yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			s, _ := goldenSnapshot(t)
			if err := printStatus(&b, s, tc.output, false); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tc.name, b.Bytes())
		})
	}
}

func TestExplainGolden(t *testing.T) {
	for _, node := range goldenNodes {
		t.Run(node, func(t *testing.T) {
			s, events := goldenSnapshot(t)
			views := s.views()
			var b bytes.Buffer
			for _, v := range views {
				if v.Name == node {
					explain(&b, s, views, v, events[node])
				}
			}
			if b.Len() == 0 {
				t.Fatalf("node %s not in the fleet", node)
			}
			checkGolden(t, "explain-"+node, b.Bytes())
		})
	}
}
