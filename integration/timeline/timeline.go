// Package timeline turns a real run's Events and metrics into a picture of one remediation: the
// fault, the decision, cordon, drain, termination and the replacement becoming ready, on one
// time axis, above the remediator's own gauges and counters sampled during the run. It reads
// what the cluster recorded (the agents', the remediator's, kube-controller-manager's and the
// simulated fleet's Events about the node and its replacement) and what the remediator
// reported on /metrics (Sampler), so the picture shows what happened, not what was meant to.
package timeline

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"math"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Point is one Event on the timeline.
type Point struct {
	At      time.Time
	Node    string
	Source  string
	Reason  string
	Message string
}

// Collect returns the Events about node and about the node that replaced it (the one whose
// ReplacementJoined Event names it), oldest first.
func Collect(ctx context.Context, client kubernetes.Interface, node string) ([]Point, error) {
	list, err := client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node"})
	if err != nil {
		return nil, fmt.Errorf("list node events: %w", err)
	}
	names := map[string]bool{node: true}
	for _, ev := range list.Items {
		if ev.Reason == "ReplacementJoined" && strings.HasSuffix(ev.Message, "replacing "+node) {
			names[ev.InvolvedObject.Name] = true
		}
	}
	var out []Point
	for _, ev := range list.Items {
		if !names[ev.InvolvedObject.Name] {
			continue
		}
		out = append(out, Point{At: when(ev), Node: ev.InvolvedObject.Name, Source: source(ev), Reason: ev.Reason, Message: ev.Message})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no Events about node %s (Events live one hour)", node)
	}
	// Events' timestamps have whole seconds (FirstTimestamp), so a reaction within the second of
	// its fault ties with it, and the API lists ties in name order, which says nothing of
	// which came first. The fault goes first among its ties, so that cutting the story at it
	// keeps what it caused.
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].At.Equal(out[j].At) {
			return out[i].At.Before(out[j].At)
		}
		return out[i].Reason == faultInjected && out[j].Reason != faultInjected
	})
	// The story starts at the fault, when one was injected (the node's boot is another story).
	for i, p := range out {
		if p.Reason == faultInjected && p.Node == node {
			out = out[i:]
			break
		}
	}
	return out, nil
}

// faultInjected is the fleet's Event reason for an injected fault (fleet.EventFaultInjected;
// not imported, so that this package does not depend on the fleet).
const faultInjected = "FaultInjected"

func when(ev corev1.Event) time.Time {
	for _, t := range []time.Time{ev.EventTime.Time, ev.FirstTimestamp.Time, ev.CreationTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

func source(ev corev1.Event) string {
	if ev.Source.Component != "" {
		return ev.Source.Component
	}
	return ev.ReportingController
}

// milestones are the steps of one remediation, in order, and the Event reasons that mark them:
// the remediator's own, its interruption handling's (a node drained for an AWS event), and the
// fleet's (the fault, AWS reclaiming a spot instance, the replacement).
var milestones = []struct {
	name    string
	reasons []string
	colour  string
}{
	{"fault", []string{"FaultInjected"}, "#d62728"},
	{"decided", []string{"RemediationStarted"}, "#ff7f0e"},
	{"cordoned", []string{"Cordoned", "InterruptionCordoned"}, "#bcbd22"},
	{"drain started", []string{"DrainStarted", "InterruptionDraining"}, "#9467bd"},
	{"drained", []string{"DrainCompleted", "DrainTimedOut", "InterruptionDrained"}, "#8c564b"},
	{"terminated", []string{"InstanceTerminated", "TerminationRequested", "InstanceReclaimed"}, "#1f77b4"},
	{"replacement joined", []string{"ReplacementJoined"}, "#17becf"},
	{"replacement ready", []string{"StartupTaintsRemoved"}, "#2ca02c"},
}

// SVG draws the points about node (and its replacement): a bar of the remediation's phases (from
// one milestone to the next) on top; then, if metrics is not nil, one lane per series with its
// value over the same time axis (a step line scaled to the series' own maximum); then one row
// per Event with its offset from the first, reason, node and source.
func SVG(title, node string, points []Point, metrics *Sampled) []byte {
	const (
		left, width, row, barY, barH = 20.0, 560.0, 18.0, 60.0, 26.0
	)
	t0, t1 := points[0].At, points[len(points)-1].At
	span := t1.Sub(t0).Seconds()
	if span <= 0 {
		span = 1
	}
	x := func(t time.Time) float64 { return left + width*t.Sub(t0).Seconds()/span }
	lanesY := barY + barH + 80 // below four staggered rows of milestone labels
	listY := lanesY
	var lanes []lane
	if metrics != nil {
		lanes = metricLanes(metrics, t0, t1)
		listY += laneH * float64(len(lanes))
		if len(lanes) > 0 {
			listY += 32 // the caption under the lanes
		}
	}
	h := listY + row*float64(len(points)) + 20
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", int(left+width+470), int(h))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	sources := "the cluster's Events"
	if len(lanes) > 0 {
		sources += " and the remediator's metrics"
	}
	fmt.Fprintf(&b, `<text x="%g" y="40" fill="#555">%s, %s in all; generated from %s by integration/timeline</text>`+"\n",
		left, t0.UTC().Format("2006-01-02 15:04:05 UTC"), t1.Sub(t0).Round(time.Second), sources)
	// Phase bar: each milestone's first occurrence, in order of time.
	type mark struct {
		at     time.Time
		name   string
		colour string
	}
	var marks []mark
	for _, m := range milestones {
		for _, p := range points {
			replacement := p.Node != node
			if containsStr(m.reasons, p.Reason) && replacement == strings.HasPrefix(m.name, "replacement") {
				marks = append(marks, mark{p.At, m.name, m.colour})
				break
			}
		}
	}
	sort.SliceStable(marks, func(i, j int) bool { return marks[i].at.Before(marks[j].at) })
	for i, m := range marks {
		end := t1
		if i+1 < len(marks) {
			end = marks[i+1].at
		}
		w := x(end) - x(m.at)
		if w < 1 {
			w = 1
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%g" width="%.1f" height="%g" fill="%s" opacity="0.85"><title>%s</title></rect>`+"\n",
			x(m.at), barY, w, barH, m.colour, html.EscapeString(m.name))
		labelY := barY + barH + 14 + float64(i%4)*14 // milestones often share a second
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="%s"/>`+"\n", x(m.at), barY, x(m.at), labelY-10, m.colour)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" fill="%s">%s +%.0fs</text>`+"\n", x(m.at)+2, labelY, m.colour,
			html.EscapeString(m.name), m.at.Sub(t0).Seconds())
	}
	// The metrics, one lane per series.
	for i, l := range lanes {
		top := lanesY + laneH*float64(i)
		base := top + laneH - 8
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#ccc"/>`+"\n", left, base, left+width, base)
		var pts strings.Builder
		prev := math.NaN()
		for _, s := range l.steps {
			y := base - (laneH-14)*s.v/l.max
			if !math.IsNaN(prev) {
				fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.at), prev) // hold the last value until this sample
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.at), y)
			prev = y
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f4e79" stroke-width="1.5" points="%s"/>`+"\n", strings.TrimSpace(pts.String()))
		fmt.Fprintf(&b, `<text x="%g" y="%g" fill="#1f4e79">%s: 0 to %g</text>`+"\n", left+width+12, base-2,
			html.EscapeString(l.label), l.peak)
	}
	if len(lanes) > 0 {
		fmt.Fprintf(&b, `<text x="%g" y="%g" fill="#555">above: the remediator's /metrics, sampled every %s during the run (%d samples)</text>`+"\n",
			left, lanesY+laneH*float64(len(lanes))+10, metrics.interval(), len(metrics.Samples))
	}
	// Every Event.
	for i, p := range points {
		y := listY + row*float64(i)
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%g" r="4" fill="#333"/>`+"\n", x(p.At), y-4)
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#eee"/>`+"\n", left, y+3, left+width, y+3)
		fmt.Fprintf(&b, `<text x="%g" y="%g"><tspan font-weight="bold">+%5.1fs %s</tspan> %s (%s)<title>%s</title></text>`+"\n",
			left+width+12, y, p.At.Sub(t0).Seconds(), html.EscapeString(p.Reason), html.EscapeString(p.Node),
			html.EscapeString(p.Source), html.EscapeString(p.Message))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// laneH is the height of one metric's lane.
const laneH = 34.0

type step struct {
	at time.Time
	v  float64
}

// lane is one series within the picture's time range.
type lane struct {
	label string
	steps []step
	peak  float64 // the largest value seen
	max   float64 // the lane's full scale: peak, at least 1
}

// metricLanes clips the samples to [t0, t1]; the last sample before t0 opens each lane, so a
// value that was already up when the story starts is drawn from its start.
func metricLanes(m *Sampled, t0, t1 time.Time) []lane {
	var first int
	for i, s := range m.Samples {
		if !s.At.After(t0) {
			first = i
		}
	}
	var out []lane
	for i, se := range m.Series {
		l := lane{label: se.Label}
		for _, s := range m.Samples[first:] {
			if s.At.After(t1) || i >= len(s.Values) {
				break
			}
			at := s.At
			if at.Before(t0) {
				at = t0
			}
			l.steps = append(l.steps, step{at, s.Values[i]})
			l.peak = max(l.peak, s.Values[i])
		}
		if len(l.steps) == 0 {
			continue
		}
		l.max = max(l.peak, 1)
		out = append(out, l)
	}
	return out
}

// interval is the median gap between samples, for the caption.
func (m *Sampled) interval() time.Duration {
	if len(m.Samples) < 2 {
		return 0
	}
	gaps := make([]time.Duration, 0, len(m.Samples)-1)
	for i := 1; i < len(m.Samples); i++ {
		gaps = append(gaps, m.Samples[i].At.Sub(m.Samples[i-1].At))
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	return gaps[len(gaps)/2].Round(10 * time.Millisecond)
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
