package timeline

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestSVGMilestones: each milestone is drawn once, at the first Event that marks it, and the
// startup-taint removal counts as "replacement ready" only on the replacement, never on the
// node that died (which removed its own taint when it booted).
func TestSVGMilestones(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tests := []struct {
		name   string
		points []Point
		want   []string // milestone labels, in order
		absent []string
	}{
		{
			name: "full remediation",
			points: []Point{
				{At: at(0), Node: "a", Reason: "FaultInjected"},
				{At: at(18), Node: "a", Reason: "RemediationStarted"},
				{At: at(18), Node: "a", Reason: "Cordoned"},
				{At: at(18), Node: "a", Reason: "DrainStarted"},
				{At: at(38), Node: "a", Reason: "DrainTimedOut"},
				{At: at(38), Node: "a", Reason: "InstanceTerminated"},
				{At: at(39), Node: "b", Reason: "ReplacementJoined"},
				{At: at(43), Node: "b", Reason: "StartupTaintsRemoved"},
			},
			want: []string{"fault +0s", "decided +18s", "cordoned +18s", "drain started +18s", "drained +38s",
				"terminated +38s", "replacement joined +39s", "replacement ready +43s"},
		},
		{
			name: "a spot notice: drained for AWS, reclaimed by AWS",
			points: []Point{
				{At: at(0), Node: "a", Reason: "FaultInjected"},
				{At: at(3), Node: "a", Reason: "InterruptionCordoned"},
				{At: at(4), Node: "a", Reason: "InterruptionDrained"},
				{At: at(120), Node: "a", Reason: "InstanceReclaimed"},
				{At: at(121), Node: "b", Reason: "ReplacementJoined"},
				{At: at(127), Node: "b", Reason: "StartupTaintsRemoved"},
			},
			want:   []string{"fault +0s", "cordoned +3s", "drained +4s", "terminated +120s", "replacement joined +121s", "replacement ready +127s"},
			absent: []string{"decided"},
		},
		{
			name: "the dead node's own taint removal is not the replacement's",
			points: []Point{
				{At: at(0), Node: "a", Reason: "StartupTaintsRemoved"},
				{At: at(5), Node: "a", Reason: "FaultInjected"},
			},
			want:   []string{"fault +5s"},
			absent: []string{"replacement ready"},
		},
	}
	label := regexp.MustCompile(`fill="#[0-9a-f]+">([a-z ]+ \+\d+s)</text>`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svg := string(SVG("title <&>", "a", tt.points, nil))
			var got []string
			for _, m := range label.FindAllStringSubmatch(svg, -1) {
				got = append(got, m[1])
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("milestones\n got %q\nwant %q", got, tt.want)
			}
			for _, a := range tt.absent {
				if strings.Contains(strings.Join(got, "|"), a) {
					t.Errorf("milestone %q drawn: %q", a, got)
				}
			}
			if !strings.Contains(svg, "title &lt;&amp;&gt;") {
				t.Error("the title is not escaped")
			}
			if n := strings.Count(svg, "<circle"); n != len(tt.points) {
				t.Errorf("%d event markers, want %d", n, len(tt.points))
			}
		})
	}
}

// TestCollectKeepsTheFaultsOwnSecond: Events carry whole seconds, so a reaction within the
// second of its fault ties with it, and the API lists ties in name order (here the reaction's
// name sorts first). The story starts at the fault and must keep the reaction.
func TestCollectKeepsTheFaultsOwnSecond(t *testing.T) {
	sec := time.Date(2026, 11, 24, 7, 34, 57, 0, time.UTC)
	event := func(name, node, reason string, at time.Time) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node},
			Reason:         reason, FirstTimestamp: metav1.NewTime(at),
		}
	}
	tests := []struct {
		name   string
		events []*corev1.Event
		want   []string
	}{
		{"reaction listed before its fault in the same second", []*corev1.Event{
			event("n1.0boot", "n1", "RegisteredNode", sec.Add(-time.Minute)),
			event("n1.18a0", "n1", "InterruptionCordoned", sec),
			event("n1.x7k2p", "n1", "FaultInjected", sec),
			event("n1.18a1", "n1", "InterruptionDrained", sec.Add(time.Second)),
		}, []string{"FaultInjected", "InterruptionCordoned", "InterruptionDrained"}},
		{"another node's events stay out", []*corev1.Event{
			event("n1.a", "n1", "FaultInjected", sec),
			event("n2.a", "n2", "InterruptionCordoned", sec),
		}, []string{"FaultInjected"}},
		{"no fault: the whole story", []*corev1.Event{
			event("n1.b", "n1", "Cordoned", sec.Add(time.Second)),
			event("n1.a", "n1", "RegisteredNode", sec),
		}, []string{"RegisteredNode", "Cordoned"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientset()
			for _, ev := range tt.events {
				if _, err := c.CoreV1().Events(ev.Namespace).Create(t.Context(), ev, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			points, err := Collect(t.Context(), c, "n1")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range points {
				got = append(got, p.Reason)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("story = %v, want %v", got, tt.want)
			}
		})
	}
}
