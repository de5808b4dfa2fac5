package memory

import "github.com/prometheus/client_golang/prometheus"

// oomKillsDesc describes the kernel's OOM-kill counter as exported by the agent.
var oomKillsDesc = prometheus.NewDesc(
	"nodevigil_memory_oom_kills_total",
	"Processes killed by the kernel OOM killer since the node booted (oom_kill in /proc/vmstat), as last read by the memory check.",
	nil, nil,
)

// Describe implements prometheus.Collector, so the agent registers the check's metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- oomKillsDesc }

// Collect implements prometheus.Collector. Nothing is exported until the counter was read
// (a kernel older than 4.13 has none).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if n, ok := c.OOMKills(); ok {
		ch <- prometheus.MustNewConstMetric(oomKillsDesc, prometheus.CounterValue, float64(n))
	}
}
