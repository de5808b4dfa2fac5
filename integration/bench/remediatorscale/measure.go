package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// storeMax raises a to v if v is larger.
func storeMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// terminateRecorder wraps the EC2 emulator and notes when the first TerminateInstances request
// naming each instance arrived, before the emulator handles it: the emulator records what it
// did but not when.
type terminateRecorder struct {
	emu   *ec2emu.Server
	mu    sync.Mutex
	first map[string]time.Time
	calls int
}

func (r *terminateRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	req.Body.Close()
	if err == nil {
		req.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		for k, vs := range req.URL.Query() {
			form[k] = append(form[k], vs...)
		}
		if form.Get("Action") == ec2emu.ActionTerminateInstances {
			r.mu.Lock()
			r.calls++
			for k, vs := range form {
				if !strings.HasPrefix(k, "InstanceId.") {
					continue
				}
				for _, id := range vs {
					if _, seen := r.first[id]; !seen {
						r.first[id] = at
					}
				}
			}
			r.mu.Unlock()
		}
	}
	r.emu.ServeHTTP(w, req)
}

func (r *terminateRecorder) arrival(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.first[id]
	return t, ok
}

// sample is one reading of the processes' /proc counters.
type sample struct {
	at       time.Time
	rssKB    int64
	hwmKB    int64
	remTicks int64 // remediator utime+stime
	cpTicks  int64 // etcd + kube-apiserver
	genTicks int64 // this process: the load generator
}

// sampler reads /proc for the remediator, the control plane and itself every interval.
type sampler struct {
	mu      sync.Mutex
	samples []sample
}

func (s *sampler) run(ctx context.Context, every time.Duration, remPid int, cpPids []int) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		sm := sample{at: time.Now()}
		var err error
		if sm.rssKB, sm.hwmKB, err = memKB(remPid); err == nil {
			sm.remTicks, _ = cpuTicks(strconv.Itoa(remPid))
			for _, p := range cpPids {
				v, _ := cpuTicks(strconv.Itoa(p))
				sm.cpTicks += v
			}
			sm.genTicks, _ = cpuTicks("self")
			s.mu.Lock()
			s.samples = append(s.samples, sm)
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// phaseStats summarises the samples taken in [from, to].
type phaseStats struct {
	name                  string
	dur                   time.Duration
	n                     int
	rssMedian, rssMax     float64       // MiB
	hwm                   float64       // MiB, the kernel's peak RSS at the end of the phase
	maxAfter              time.Duration // when the largest sample was taken, from the phase's start
	remCPU, cpCPU, genCPU float64       // mCPU
}

func (s *sampler) phase(name string, from, to time.Time) phaseStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var in []sample
	for _, sm := range s.samples {
		if !sm.at.Before(from) && !sm.at.After(to) {
			in = append(in, sm)
		}
	}
	ps := phaseStats{name: name, dur: to.Sub(from), n: len(in)}
	if len(in) == 0 {
		return ps
	}
	rss := make([]int64, len(in))
	var top int64
	for i, sm := range in {
		rss[i] = sm.rssKB
		if sm.rssKB > top {
			top, ps.maxAfter = sm.rssKB, sm.at.Sub(from)
		}
	}
	slices.Sort(rss)
	ps.rssMedian = float64(rss[len(rss)/2]) / 1024
	ps.rssMax = float64(rss[len(rss)-1]) / 1024
	last := in[len(in)-1]
	ps.hwm = float64(last.hwmKB) / 1024
	if len(in) > 1 {
		first := in[0]
		secs := last.at.Sub(first.at).Seconds()
		const ticksPerSecond = 100 // USER_HZ on Linux
		ps.remCPU = float64(last.remTicks-first.remTicks) / ticksPerSecond / secs * 1000
		ps.cpCPU = float64(last.cpTicks-first.cpTicks) / ticksPerSecond / secs * 1000
		ps.genCPU = float64(last.genTicks-first.genTicks) / ticksPerSecond / secs * 1000
	}
	return ps
}

func memKB(pid int) (rss, hwm int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss, _ = strconv.ParseInt(f[1], 10, 64)
		case "VmHWM:":
			hwm, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS for pid %d", pid)
	}
	return rss, hwm, nil
}

func cpuTicks(pid string) (int64, error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime, nil
}

// metrics is a scrape: metric name → label set (as written) → value.
type metrics map[string]map[string]float64

// scrape reads a Prometheus text exposition. It keeps every sample; names include the _bucket,
// _sum and _count suffixes.
func scrape(ctx context.Context, base string) (metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", base, err)
	}
	defer resp.Body.Close()
	out := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		name, labels := line[:sp], ""
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name, labels = line[:i], line[i+1:strings.LastIndexByte(line[:sp], '}')]
		}
		if out[name] == nil {
			out[name] = map[string]float64{}
		}
		out[name][labels] = v
	}
	return out, sc.Err()
}

// get returns the value of name whose labels contain every one of want (`k="v"` strings).
func (m metrics) get(name string, want ...string) float64 {
	var sum float64
	for labels, v := range m[name] {
		ok := true
		for _, w := range want {
			if !strings.Contains(labels, w) {
				ok = false
			}
		}
		if ok {
			sum += v
		}
	}
	return sum
}

// histogram is a Prometheus histogram's cumulative buckets, minus a baseline.
type histogram struct {
	les    []float64
	counts []float64
	count  float64
	sum    float64
}

func (m metrics) histogram(name string, base metrics, want ...string) histogram {
	var h histogram
	byLE := map[float64]float64{}
	for labels, v := range m[name+"_bucket"] {
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(labels, w)
		}
		if !ok {
			continue
		}
		i := strings.Index(labels, `le="`)
		if i < 0 {
			continue
		}
		s := labels[i+4:]
		s = s[:strings.IndexByte(s, '"')]
		le, err := strconv.ParseFloat(s, 64)
		if err != nil {
			continue
		}
		byLE[le] += v - base[name+"_bucket"][labels]
	}
	for le := range byLE {
		h.les = append(h.les, le)
	}
	sort.Float64s(h.les)
	for _, le := range h.les {
		h.counts = append(h.counts, byLE[le])
	}
	h.count = m.get(name+"_count", want...) - base.get(name+"_count", want...)
	h.sum = m.get(name+"_sum", want...) - base.get(name+"_sum", want...)
	return h
}

// quantile interpolates within the bucket holding rank q, as histogram_quantile does. It says
// "> le" when the rank falls in the +Inf bucket.
func (h histogram) quantile(q float64) string {
	if h.count == 0 {
		return "n/a"
	}
	rank := q * h.count
	prevLE, prevCount := 0.0, 0.0
	for i, le := range h.les {
		if h.counts[i] >= rank {
			if math.IsInf(le, 1) {
				return fmt.Sprintf("> %gs", prevLE)
			}
			frac := 0.0
			if h.counts[i] > prevCount {
				frac = (rank - prevCount) / (h.counts[i] - prevCount)
			}
			return fmt.Sprintf("%.2fs (bucket ≤ %gs)", prevLE+(le-prevLE)*frac, le)
		}
		prevLE, prevCount = le, h.counts[i]
	}
	return "n/a"
}

// logRecord is the part of the remediator's JSON log lines this program reads.
type logRecord struct {
	Time   time.Time `json:"time"`
	Msg    string    `json:"msg"`
	Node   string    `json:"node"`
	Reason string    `json:"reason"`
}

// parseLog returns the JSON records of the remediator's log; lines that are not JSON (klog
// output) are skipped.
func parseLog(text string) []logRecord {
	var out []logRecord
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var r logRecord
		if json.Unmarshal([]byte(line), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// dist summarises durations: p50, p99 and max, nearest-rank.
type dist []time.Duration

func (d dist) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func (d dist) String() string {
	if len(d) == 0 {
		return "n/a"
	}
	r := func(x time.Duration) string { return x.Round(time.Millisecond).String() }
	return fmt.Sprintf("p50 %s · p99 %s · max %s (n=%d)", r(d.pct(0.5)), r(d.pct(0.99)), r(d.pct(1)), len(d))
}
