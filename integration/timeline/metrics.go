package timeline

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Series is one line of the picture's metrics panel: every sample of Metric whose labels
// include Labels, added up within one scrape. Across several endpoints (the replicas of the
// remediator) counters are added, since each replica counts only what it did, and gauges take
// the largest value, since only the leader's census is the cluster's.
type Series struct {
	// Label names the line in the picture.
	Label string
	// Metric is the metric family's name.
	Metric string
	// Labels, if set, select the samples of the family that count.
	Labels map[string]string
}

// RemediatorSeries is the remediator's side of one remediation, as its /metrics tells it: how
// many nodes it judges unhealthy, how many are in the pipeline and draining, and the
// terminations EC2 accepted.
var RemediatorSeries = []Series{
	{Label: "unhealthy nodes", Metric: "nodevigil_remediator_unhealthy_nodes"},
	{Label: "in flight", Metric: "nodevigil_remediator_in_flight"},
	{Label: "draining", Metric: "nodevigil_remediator_draining_nodes"},
	{Label: "terminations accepted", Metric: "nodevigil_remediator_terminations_total", Labels: map[string]string{"result": "Terminating"}},
}

// Sample is one scrape of every endpoint: Values[i] is Series[i]'s value (0 where the family
// was absent).
type Sample struct {
	At     time.Time
	Values []float64
}

// Sampled is what a Sampler saw: the series and their values over time, oldest first.
type Sampled struct {
	Series  []Series
	Samples []Sample
	// Failed counts scrapes that failed (an endpoint down, e.g. a replica restarting); they
	// leave a gap rather than a zero.
	Failed int
}

// SamplerConfig says what to scrape and how often.
type SamplerConfig struct {
	// URLs are the /metrics endpoints to scrape (plain HTTP: the remediator with
	// --metrics-secure=false, as make run and the scenarios run it).
	URLs []string
	// Interval between scrapes; 500 ms if zero, fine enough for steps seconds apart.
	Interval time.Duration
	// Series to record; RemediatorSeries if empty.
	Series []Series
	// Client does the scrapes; one with a 2 s timeout if nil.
	Client *http.Client
	// Now is the clock the samples are stamped with; time.Now if nil.
	Now func() time.Time
}

// Sampler scrapes Prometheus endpoints during a run, so the picture can show the metrics beside
// the Events: metrics are not kept after the fact, Events are (for an hour).
type Sampler struct {
	cfg SamplerConfig

	mu  sync.Mutex
	out Sampled
}

// NewSampler returns a Sampler for cfg with its defaults filled.
func NewSampler(cfg SamplerConfig) (*Sampler, error) {
	if len(cfg.URLs) == 0 {
		return nil, fmt.Errorf("timeline: no metrics URL to sample")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if len(cfg.Series) == 0 {
		cfg.Series = RemediatorSeries
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 2 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Sampler{cfg: cfg, out: Sampled{Series: cfg.Series}}, nil
}

// Run scrapes every Interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.Scrape(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Scrape takes one sample of every endpoint now. A failed endpoint fails the whole sample
// (counted in Failed): a partial sum would draw a false drop.
func (s *Sampler) Scrape(ctx context.Context) {
	at := s.cfg.Now()
	vals := make([]float64, len(s.cfg.Series))
	for _, url := range s.cfg.URLs {
		fams, err := s.fetch(ctx, url)
		if err != nil {
			s.mu.Lock()
			s.out.Failed++
			s.mu.Unlock()
			return
		}
		for i, se := range s.cfg.Series {
			v, counter := value(fams[se.Metric], se.Labels)
			if counter {
				vals[i] += v
			} else {
				vals[i] = max(vals[i], v)
			}
		}
	}
	s.mu.Lock()
	s.out.Samples = append(s.out.Samples, Sample{At: at, Values: vals})
	s.mu.Unlock()
}

// Sampled returns a copy of what was sampled so far.
func (s *Sampler) Sampled() Sampled {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.out
	out.Samples = append([]Sample(nil), s.out.Samples...)
	return out
}

func (s *Sampler) fetch(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return fams, nil
}

// value adds up the samples of fam whose labels include want, and reports whether fam is a
// counter.
func value(fam *dto.MetricFamily, want map[string]string) (float64, bool) {
	if fam == nil {
		return 0, false
	}
	var sum float64
	for _, m := range fam.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, fam.GetType() == dto.MetricType_COUNTER
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}
