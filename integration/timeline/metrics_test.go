package timeline

import (
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// serve answers /metrics with the file's content, or 503 while *down is true.
func serve(t *testing.T, file string, down *bool) string {
	t.Helper()
	body, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if down != nil && *down {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// TestSamplerAcrossReplicas: counters add up across replicas (each counts what it did), gauges
// take the largest (the leader's census, not the follower's copy added to it), label selectors
// pick their samples, absent families read 0, and a failed endpoint drops the whole sample
// instead of drawing a false dip.
func TestSamplerAcrossReplicas(t *testing.T) {
	down := false
	leader := serve(t, "testdata/leader.txt", nil)
	follower := serve(t, "testdata/follower.txt", &down)
	now := time.Date(2026, 11, 23, 22, 0, 0, 0, time.UTC)
	s, err := NewSampler(SamplerConfig{URLs: []string{leader, follower}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s.Scrape(t.Context())
	down = true
	s.Scrape(t.Context())

	got := s.Sampled()
	if len(got.Samples) != 1 || got.Failed != 1 {
		t.Fatalf("%d samples, %d failed; want 1 and 1 (the follower down for the second)", len(got.Samples), got.Failed)
	}
	want := map[string]float64{
		"unhealthy nodes":       3, // max(2+1, 2+1), not 6
		"in flight":             1, // max(1, 0)
		"draining":              0, // absent
		"terminations accepted": 3, // 2 + 1, result="Terminating" only
	}
	for i, se := range got.Series {
		if v := got.Samples[0].Values[i]; v != want[se.Label] {
			t.Errorf("%s = %g, want %g", se.Label, v, want[se.Label])
		}
	}
	if !got.Samples[0].At.Equal(now) {
		t.Errorf("sample stamped %s, want %s", got.Samples[0].At, now)
	}
}

func TestNewSamplerNeedsAURL(t *testing.T) {
	if _, err := NewSampler(SamplerConfig{}); err == nil || !strings.Contains(err.Error(), "no metrics URL") {
		t.Fatalf("NewSampler with no URL: %v, want an error naming the missing URL", err)
	}
}

// TestSVGMetricLanes: one lane per series with samples in the picture's time range, each a step
// line scaled to its own peak and labelled with it; samples outside the range are clipped, the
// last one before the start opens the lane; no metrics, no lanes.
func TestSVGMetricLanes(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	points := []Point{{At: at(0), Node: "a", Reason: "FaultInjected"}, {At: at(40), Node: "a", Reason: "InstanceTerminated"}}
	m := &Sampled{
		Series: []Series{{Label: "in flight"}, {Label: "terminations accepted"}},
		Samples: []Sample{
			{At: at(-5), Values: []float64{0, 4}},
			{At: at(10), Values: []float64{1, 4}},
			{At: at(40), Values: []float64{0, 5}},
			{At: at(50), Values: []float64{7, 9}}, // after the last Event: clipped
		},
	}
	svg := string(SVG("t", "a", points, m))
	lines := regexp.MustCompile(`<polyline [^>]*points="([^"]*)"`).FindAllStringSubmatch(svg, -1)
	if len(lines) != 2 {
		t.Fatalf("%d metric lines, want 2:\n%s", len(lines), svg)
	}
	// in flight: 0 from t0 (the sample at -5 s opens the lane), 1 from +10 s, 0 at +40 s.
	// x = 20 + 560*s/40; the lane's baseline is at y 192 (lanes start at 166, 34 high, 8 above
	// the bottom) and full scale 20 above it.
	if want := "20.0,192.0 160.0,192.0 160.0,172.0 580.0,172.0 580.0,192.0"; lines[0][1] != want {
		t.Errorf("in-flight line %q, want %q", lines[0][1], want)
	}
	for _, label := range []string{"in flight: 0 to 1", "terminations accepted: 0 to 5"} {
		if !strings.Contains(svg, label) {
			t.Errorf("no lane labelled %q", label)
		}
	}
	if strings.Contains(svg, "to 7") || strings.Contains(svg, "to 9") {
		t.Error("a sample after the last Event was drawn")
	}
	if !strings.Contains(svg, "sampled every 15s") {
		t.Errorf("caption lacks the median sampling interval: %s", svg)
	}
	if n := strings.Count(string(SVG("t", "a", points, nil)), "<polyline"); n != 0 {
		t.Errorf("%d metric lines without metrics", n)
	}
}
