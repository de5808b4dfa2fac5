package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/fakeproc"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestCheckFixtures runs the check twice over each fixture host root, EnterAfter apart, so
// that each case shows both the first (hysteresis-held) result and the settled verdict.
func TestCheckFixtures(t *testing.T) {
	tests := []struct {
		name      string
		host      string // under testdata/hosts, or absolute
		cfg       func(*Config)
		first     collectors.Status // status of the first check
		status    collectors.Status // status once EnterAfter has passed
		reason    string
		msg       []string // substrings of the settled message
		wantErr   bool
		errIsNote error // if set, errors.Is(res.Err, errIsNote) must hold
	}{
		{
			name: "healthy", host: "healthy",
			first: collectors.StatusHealthy, status: collectors.StatusHealthy, reason: ReasonNoMemoryPressure,
			msg: []string{"full avg10=0.50% avg60=0.20% from node (enter 25%, exit 10%)", "MemAvailable 5.0Gi of 7.6Gi (65.8%; PSI counts below 779Mi, critical below 389Mi, clear at 779Mi)"},
		},
		{
			// One container stalling against its own cgroup limit raises node PSI too; with
			// 65% of memory available the node is not short and must not be marked.
			name: "node PSI over enter level on a roomy node is not pressure", host: "pressure",
			first: collectors.StatusHealthy, status: collectors.StatusHealthy, reason: ReasonNoMemoryPressure,
			msg: []string{"full avg10=32.10% avg60=20.00% from node (enter 25%, exit 10%)", "PSI is high but memory is not low"},
		},
		{
			name: "node PSI over enter level while MemAvailable is low", host: "pressure-lowmem",
			first: collectors.StatusHealthy, status: collectors.StatusUnhealthy, reason: ReasonMemoryPressure,
			msg: []string{"full avg10=32.10% avg60=28.00% from node (enter 25%, exit 10%)", "MemAvailable 545Mi of 7.6Gi (7.0%; PSI counts below 779Mi"},
		},
		{
			name: "MemAvailable under enter level", host: "lowmem",
			first: collectors.StatusHealthy, status: collectors.StatusUnhealthy, reason: ReasonLowMemoryAvailable,
			msg: []string{"MemAvailable 312Mi of 7.6Gi (4.0%; PSI counts below 779Mi, critical below 389Mi, clear at 779Mi)"},
		},
		{
			name: "no PSI falls back to meminfo", host: "no-psi",
			first: collectors.StatusHealthy, status: collectors.StatusHealthy, reason: ReasonNoMemoryPressure,
			msg: []string{"memory PSI unsupported by this kernel, judging by meminfo alone", "MemAvailable 5.0Gi"},
		},
		{
			name: "no PSI and low memory", host: "no-psi-lowmem",
			first: collectors.StatusHealthy, status: collectors.StatusUnhealthy, reason: ReasonLowMemoryAvailable,
			msg: []string{"PSI unsupported", "MemAvailable 312Mi"},
		},
		{
			name: "no PSI, meminfo rule disabled, still judged by meminfo", host: "no-psi-lowmem",
			cfg:   func(c *Config) { c.AvailableEnterPercent = -1 },
			first: collectors.StatusHealthy, status: collectors.StatusUnhealthy, reason: ReasonLowMemoryAvailable,
			msg: []string{"PSI unsupported", "(4.0%; critical below 389Mi, clear at 779Mi)"},
		},
		{
			name: "PSI rule disabled", host: "pressure",
			cfg:   func(c *Config) { c.PSIFullEnterPercent = -1 },
			first: collectors.StatusHealthy, status: collectors.StatusHealthy, reason: ReasonNoMemoryPressure,
			msg: []string{"memory PSI not judged", "MemAvailable 5.0Gi"},
		},
		{
			name: "meminfo rule disabled ignores low memory", host: "lowmem",
			cfg:   func(c *Config) { c.AvailableEnterPercent = -1 },
			first: collectors.StatusHealthy, status: collectors.StatusHealthy, reason: ReasonNoMemoryPressure,
			msg: []string{"full avg10=0.00%"},
		},
		{
			name: "kubepods.slice (systemd driver) worse than node", host: "kubepods-systemd",
			first: collectors.StatusHealthy, status: collectors.StatusUnhealthy, reason: ReasonMemoryPressure,
			msg: []string{"full avg10=41.25% avg60=30.00% from kubepods (node 1.50%)"},
		},
		{
			name: "kubepods (cgroupfs driver) worse than node", host: "kubepods-cgroupfs",
			first: collectors.StatusHealthy, status: collectors.StatusUnhealthy, reason: ReasonMemoryPressure,
			msg: []string{"full avg10=27.00% avg60=27.00% from kubepods (node 1.50%)"},
		},
		{
			name: "node worse than kubepods", host: "kubepods-calm",
			first: collectors.StatusHealthy, status: collectors.StatusUnhealthy, reason: ReasonMemoryPressure,
			msg: []string{"full avg10=30.00% avg60=30.00% from node (kubepods 0.50%)"},
		},
		{
			name: "malformed node PSI", host: "malformed-psi",
			first: collectors.StatusUnknown, status: collectors.StatusUnknown, reason: ReasonPSIUnreadable,
			msg: []string{"/proc/pressure/memory"}, wantErr: true,
		},
		{
			name: "empty node PSI", host: "empty-psi",
			first: collectors.StatusUnknown, status: collectors.StatusUnknown, reason: ReasonPSIUnreadable,
			msg: []string{"/proc/pressure/memory"}, wantErr: true,
		},
		{
			name: "NaN in node PSI", host: "nan-psi",
			first: collectors.StatusUnknown, status: collectors.StatusUnknown, reason: ReasonPSIUnreadable,
			msg: []string{"not a percentage"}, wantErr: true,
		},
		{
			name: "malformed kubepods PSI", host: "kubepods-malformed",
			first: collectors.StatusUnknown, status: collectors.StatusUnknown, reason: ReasonPSIUnreadable,
			msg: []string{"/sys/fs/cgroup/kubepods.slice/memory.pressure", "full line"}, wantErr: true,
		},
		{
			name: "malformed meminfo", host: "malformed-meminfo",
			first: collectors.StatusUnknown, status: collectors.StatusUnknown, reason: ReasonMeminfoUnreadable,
			msg: []string{"/proc/meminfo"}, wantErr: true,
		},
		{
			name: "meminfo without MemAvailable", host: "no-memavailable",
			first: collectors.StatusUnknown, status: collectors.StatusUnknown, reason: ReasonMeminfoUnreadable,
			msg: []string{"no MemAvailable"}, wantErr: true,
		},
		{
			name: "no proc under host root", host: filepath.Join(os.TempDir(), "nodevigil-memory-test-does-not-exist"),
			first: collectors.StatusUnknown, status: collectors.StatusUnknown, reason: ReasonMeminfoUnreadable,
			msg: []string{"open proc under host root"}, wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host := tt.host
			if !filepath.IsAbs(host) {
				host = filepath.Join("testdata", "hosts", host)
			}
			clk := testingclock.NewFakePassiveClock(t0)
			cfg := Config{HostRoot: host, Now: clk.Now, Logger: discardLogger()}
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			c, err := New(cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}

			first := c.Check(context.Background())
			if first.Status != tt.first {
				t.Errorf("first check: status %s (%s: %s), want %s", first.Status, first.Reason, first.Message, tt.first)
			}
			clk.SetTime(t0.Add(DefaultEnterAfter))
			res := c.Check(context.Background())

			if res.Check != "memory" || c.Name() != "memory" {
				t.Errorf("check name %q / %q, want memory", res.Check, c.Name())
			}
			if !res.Time.Equal(t0.Add(DefaultEnterAfter)) {
				t.Errorf("time %v, want the fake clock's %v", res.Time, t0.Add(DefaultEnterAfter))
			}
			if res.Status != tt.status || res.Reason != tt.reason {
				t.Errorf("got %s/%s (%s), want %s/%s", res.Status, res.Reason, res.Message, tt.status, tt.reason)
			}
			if (res.Err != nil) != tt.wantErr {
				t.Errorf("err = %v, want error: %v", res.Err, tt.wantErr)
			}
			if res.Status == collectors.StatusUnknown && res.Err == nil {
				t.Errorf("unknown result without Err")
			}
			for _, s := range tt.msg {
				if !strings.Contains(res.Message, s) {
					t.Errorf("message %q does not contain %q", res.Message, s)
				}
			}
		})
	}
}

// step is one check in a hysteresis scenario: the clock moves by advance, the host files are
// rewritten, then the check runs.
type step struct {
	advance time.Duration
	full10  float64 // node PSI full avg10
	availPc float64 // MemAvailable in percent of MemTotal
	psiText string  // if set, written verbatim to /proc/pressure/memory instead
	status  collectors.Status
	reason  string
}

const totalKB = 8 << 20 // an 8 GiB node: 5% = 410Mi, 10% = 819Mi, both below the byte caps

func writeHost(t *testing.T, root string, s step) {
	t.Helper()
	psi := s.psiText
	if psi == "" {
		psi = fmt.Sprintf("some avg10=%.2f avg60=0.00 avg300=0.00 total=1\nfull avg10=%.2f avg60=0.00 avg300=0.00 total=1\n", s.full10, s.full10)
	}
	avail := uint64(float64(totalKB) * s.availPc / 100)
	meminfo := fmt.Sprintf("MemTotal: %d kB\nMemFree: %d kB\nMemAvailable: %d kB\n", totalKB, avail, avail)
	for name, data := range map[string]string{"proc/pressure/memory": psi, "proc/meminfo": meminfo} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// repeat returns n copies of s, for "hold this reading for a while".
func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func concat(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

const (
	healthy   = collectors.StatusHealthy
	unhealthy = collectors.StatusUnhealthy
	unknown   = collectors.StatusUnknown
)

// becomeUnhealthy drives a fresh collector (checks every 10s, EnterAfter 30s) into the
// unhealthy verdict through PSI.
var becomeUnhealthy = []step{
	{full10: 40, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
	{advance: 10 * time.Second, full10: 40, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
	{advance: 10 * time.Second, full10: 40, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
	{advance: 10 * time.Second, full10: 40, availPc: 15, status: unhealthy, reason: ReasonMemoryPressure},
}

func TestHysteresis(t *testing.T) {
	const tick = 10 * time.Second
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name:  "enters only after the minimum duration",
			steps: becomeUnhealthy,
		},
		{
			name: "reading between the levels restarts the enter clock",
			steps: []step{
				{full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 24, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 30, availPc: 15, status: unhealthy, reason: ReasonMemoryPressure},
			},
		},
		{
			name: "no flapping around the enter level",
			steps: func() []step {
				var s []step
				for i := range 30 {
					v := 24.0
					if i%2 == 0 {
						v = 26
					}
					s = append(s, step{advance: tick, full10: v, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure})
				}
				return s
			}(),
		},
		{
			name: "no flapping around the exit level",
			steps: concat(becomeUnhealthy, func() []step {
				var s []step
				for i := range 30 {
					v := 9.0
					if i%2 == 0 {
						v = 11
					}
					s = append(s, step{advance: tick, full10: v, availPc: 15, status: unhealthy, reason: ReasonMemoryPressure})
				}
				return s
			}()),
		},
		{
			name: "between the levels stays unhealthy; exits only after ExitAfter below the exit level",
			steps: concat(
				becomeUnhealthy,
				repeat(18, step{advance: tick, full10: 15, availPc: 15, status: unhealthy, reason: ReasonMemoryPressure}),
				// Below exit from here: pending since the first of these, 60s needed.
				repeat(6, step{advance: tick, full10: 5, availPc: 15, status: unhealthy, reason: ReasonMemoryPressure}),
				[]step{{advance: tick, full10: 5, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure}},
			),
		},
		{
			name: "MemAvailable enters and exits with its own levels",
			steps: concat(
				repeat(3, step{advance: tick, full10: 0, availPc: 4, status: healthy, reason: ReasonNoMemoryPressure}),
				[]step{{advance: tick, full10: 0, availPc: 4, status: unhealthy, reason: ReasonLowMemoryAvailable}},
				// 7% is above the enter level (5%) but below the exit level (10%).
				repeat(12, step{advance: tick, full10: 0, availPc: 7, status: unhealthy, reason: ReasonLowMemoryAvailable}),
				repeat(6, step{advance: tick, full10: 0, availPc: 12, status: unhealthy, reason: ReasonLowMemoryAvailable}),
				[]step{{advance: tick, full10: 0, availPc: 12, status: healthy, reason: ReasonNoMemoryPressure}},
			),
		},
		{
			name: "PSI alone never marks the node; memory running low with it does",
			steps: concat(
				repeat(12, step{advance: tick, full10: 60, availPc: 50, status: healthy, reason: ReasonNoMemoryPressure}),
				repeat(3, step{advance: tick, full10: 60, availPc: 19, status: healthy, reason: ReasonNoMemoryPressure}),
				[]step{{advance: tick, full10: 60, availPc: 19, status: unhealthy, reason: ReasonMemoryPressure}},
				// Memory comes back while PSI stays high: clear (a cgroup at its own limit).
				repeat(6, step{advance: tick, full10: 60, availPc: 50, status: unhealthy, reason: ReasonMemoryPressure}),
				[]step{{advance: tick, full10: 60, availPc: 50, status: healthy, reason: ReasonNoMemoryPressure}},
			),
		},
		{
			name: "a failed read restarts the enter clock",
			steps: []step{
				{full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, psiText: "garbage", availPc: 15, status: unknown, reason: ReasonPSIUnreadable},
				{advance: tick, full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 30, availPc: 15, status: healthy, reason: ReasonNoMemoryPressure},
				{advance: tick, full10: 30, availPc: 15, status: unhealthy, reason: ReasonMemoryPressure},
			},
		},
		{
			name: "a failed read keeps the verdict",
			steps: concat(becomeUnhealthy, []step{
				{advance: tick, psiText: "some avg10=1", availPc: 15, status: unknown, reason: ReasonPSIUnreadable},
				{advance: tick, full10: 40, availPc: 15, status: unhealthy, reason: ReasonMemoryPressure},
			}),
		},
		{
			name: "reason follows what is wrong now",
			steps: concat(becomeUnhealthy, []step{
				// PSI drops between the levels while memory is short: the memory reason wins.
				{advance: tick, full10: 15, availPc: 3, status: unhealthy, reason: ReasonLowMemoryAvailable},
				// Everything below the exit levels: recovering, the entry reason is kept.
				{advance: tick, full10: 1, availPc: 50, status: unhealthy, reason: ReasonMemoryPressure},
			}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			clk := testingclock.NewFakePassiveClock(t0)
			c, err := New(Config{
				HostRoot: root, Now: clk.Now, Logger: discardLogger(),
				EnterAfter: 30 * time.Second, ExitAfter: 60 * time.Second,
				// PSI counts below 20% available: the PSI scenarios run at 15%, above the
				// critical exit level (10%), so only the PSI rule is in play.
				AvailableLowPercent: 20,
			})
			if err != nil {
				t.Fatal(err)
			}
			now := t0
			for i, s := range tt.steps {
				now = now.Add(s.advance)
				clk.SetTime(now)
				writeHost(t, root, s)
				res := c.Check(context.Background())
				if res.Status != s.status || res.Reason != s.reason {
					t.Fatalf("step %d (t+%v, full=%v avail=%v%%): got %s/%s (%s), want %s/%s",
						i, now.Sub(t0), s.full10, s.availPc, res.Status, res.Reason, res.Message, s.status, s.reason)
				}
			}
		})
	}
}

func TestPendingChangeInMessage(t *testing.T) {
	root := t.TempDir()
	clk := testingclock.NewFakePassiveClock(t0)
	c, err := New(Config{HostRoot: root, Now: clk.Now, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	writeHost(t, root, step{full10: 40, availPc: 8})
	c.Check(context.Background())
	clk.SetTime(t0.Add(12 * time.Second))
	res := c.Check(context.Background())
	want := "unhealthy in 18s unless readings change (12s of 30s)"
	if res.Status != healthy || !strings.Contains(res.Message, want) {
		t.Errorf("got %s %q, want healthy with %q", res.Status, res.Message, want)
	}
}

func TestPSIUnsupportedLoggedOnce(t *testing.T) {
	root := t.TempDir()
	var logs bytes.Buffer
	clk := testingclock.NewFakePassiveClock(t0)
	c, err := New(Config{HostRoot: root, Now: clk.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	writeHost(t, root, step{full10: 0, availPc: 50})
	if err := os.Remove(filepath.Join(root, "proc/pressure/memory")); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		clk.SetTime(clk.Now().Add(10 * time.Second))
		res := c.Check(context.Background())
		if res.Status != healthy || res.Err != nil {
			t.Fatalf("got %s err=%v, want healthy without error", res.Status, res.Err)
		}
	}
	if n := strings.Count(logs.String(), "reason="+ReasonPSIUnsupported); n != 1 {
		t.Errorf("PSIUnsupported logged %d times, want once; logs:\n%s", n, logs.String())
	}

	writeHost(t, root, step{full10: 0, availPc: 50}) // PSI comes back
	for range 3 {
		c.Check(context.Background())
	}
	if n := strings.Count(logs.String(), "available again"); n != 1 {
		t.Errorf("recovery logged %d times, want once; logs:\n%s", n, logs.String())
	}
}

func TestCheckCanceled(t *testing.T) {
	c, err := New(Config{HostRoot: "testdata/hosts/healthy", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := c.Check(ctx)
	if res.Status != unknown || res.Reason != ReasonCheckCanceled || !errors.Is(res.Err, context.Canceled) {
		t.Errorf("got %s/%s err=%v, want Unknown/%s with context.Canceled", res.Status, res.Reason, res.Err, ReasonCheckCanceled)
	}
}

func TestNewValidation(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string // must appear in the error; empty means no error
	}{
		{name: "zero config", cfg: Config{}},
		{name: "exit equal to enter", cfg: Config{PSIFullEnterPercent: 20, PSIFullExitPercent: 20}},
		{name: "PSI enter over 100", cfg: Config{PSIFullEnterPercent: 120}, field: "PSIFullEnterPercent"},
		{name: "PSI exit over enter", cfg: Config{PSIFullEnterPercent: 8}, field: "PSIFullExitPercent"},
		{name: "PSI exit negative", cfg: Config{PSIFullExitPercent: -3}, field: "PSIFullExitPercent"},
		{name: "available exit below enter", cfg: Config{AvailableEnterPercent: 20}, field: "AvailableExitPercent"},
		{name: "available bytes exit below enter", cfg: Config{AvailableEnterBytes: 4 << 30}, field: "AvailableExitBytes"},
		{name: "negative duration", cfg: Config{ExitAfter: -time.Second}, field: "ExitAfter"},
		{name: "NaN level", cfg: Config{PSIFullEnterPercent: math.NaN()}, field: "PSIFullEnterPercent"},
		{name: "both rules off", cfg: Config{PSIFullEnterPercent: -1, AvailableEnterPercent: -1}, field: "enable at least one rule"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			switch {
			case tt.field == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.field != "" && (err == nil || !strings.Contains(err.Error(), tt.field)):
				t.Errorf("error %v, want one naming %q", err, tt.field)
			}
		})
	}
}

func TestFmtBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0B", 1023: "1023B", 1024: "1.0Ki", 327155712: "312Mi", 8163397632: "7.6Gi", 1 << 40: "1.0Ti",
	} {
		if got := fmtBytes(n); got != want {
			t.Errorf("fmtBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// BenchmarkCheck reads a host root with node and pod PSI and a meminfo; "+vmstat" adds a
// full-length /proc/vmstat (fakeproc.VMStat, 190 lines from a real kernel), as on a node.
func BenchmarkCheck(b *testing.B) {
	withVMStat := b.TempDir()
	if err := os.CopyFS(withVMStat, os.DirFS(filepath.Join("testdata", "hosts", "kubepods-systemd"))); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withVMStat, "proc", "vmstat"), []byte(fakeproc.VMStat), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, root string }{
		{"kubepods-systemd", filepath.Join("testdata", "hosts", "kubepods-systemd")},
		{"kubepods-systemd+vmstat", withVMStat},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := New(Config{HostRoot: bc.root, Logger: discardLogger()})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if res := c.Check(ctx); res.Err != nil {
					b.Fatal(res.Err)
				}
			}
		})
	}
}

// TestSeedFromPriorCondition: an agent restarted (or OOM-killed) during pressure must keep
// reporting it from the first check, with the prior reason, until the readings have been
// clear for ExitAfter; an unseeded collector would report Healthy at once.
func TestSeedFromPriorCondition(t *testing.T) {
	const tick = 10 * time.Second
	tests := []struct {
		name  string
		prior collectors.Prior
		seed  bool
		steps []step
	}{
		{
			name:  "unhealthy prior survives a restart during pressure",
			prior: collectors.Prior{Status: unhealthy, Reason: ReasonMemoryPressure, Since: t0.Add(-time.Hour)}, seed: true,
			steps: []step{
				{full10: 40, availPc: 8, status: unhealthy, reason: ReasonMemoryPressure},
				{advance: tick, full10: 40, availPc: 8, status: unhealthy, reason: ReasonMemoryPressure},
			},
		},
		{
			name:  "unhealthy prior with clear readings exits only after ExitAfter",
			prior: collectors.Prior{Status: unhealthy, Reason: ReasonLowMemoryAvailable}, seed: true,
			steps: concat(
				repeat(6, step{advance: tick, full10: 0, availPc: 50, status: unhealthy, reason: ReasonLowMemoryAvailable}),
				[]step{{advance: tick, full10: 0, availPc: 50, status: healthy, reason: ReasonNoMemoryPressure}},
			),
		},
		{
			name:  "healthy prior changes nothing",
			prior: collectors.Prior{Status: healthy, Reason: ReasonNoMemoryPressure}, seed: true,
			steps: []step{{full10: 40, availPc: 8, status: healthy, reason: ReasonNoMemoryPressure}},
		},
		{
			name:  "unknown prior changes nothing",
			prior: collectors.Prior{Status: unknown, Reason: ReasonPSIUnreadable}, seed: true,
			steps: []step{{full10: 0, availPc: 50, status: healthy, reason: ReasonNoMemoryPressure}},
		},
		{
			name: "without a seed the restarted agent starts healthy",
			steps: []step{
				{full10: 40, availPc: 8, status: healthy, reason: ReasonNoMemoryPressure},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			clk := testingclock.NewFakePassiveClock(t0)
			c, err := New(Config{HostRoot: root, Now: clk.Now, Logger: discardLogger(), ExitAfter: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if tt.seed {
				c.Seed(tt.prior)
			}
			now := t0
			for i, s := range tt.steps {
				now = now.Add(s.advance)
				clk.SetTime(now)
				writeHost(t, root, s)
				res := c.Check(context.Background())
				if res.Status != s.status || res.Reason != s.reason {
					t.Fatalf("step %d: got %s/%s (%s), want %s/%s", i, res.Status, res.Reason, res.Message, s.status, s.reason)
				}
			}
		})
	}
}

// TestOneShot: `check` has one reading and no history; it judges PSI full avg60 and the
// instant MemAvailable and reports pressure at once.
func TestOneShot(t *testing.T) {
	tests := []struct {
		name    string
		host    string
		psi     string // if set, overrides the fixture's PSI file (written to a copy)
		status  collectors.Status
		reason  string
		msg     []string
		noInput bool
	}{
		{name: "pressure with low memory", host: "pressure-lowmem", status: unhealthy, reason: ReasonMemoryPressure,
			msg: []string{"one reading: worst avg60 28.00% judged"}},
		{name: "critically low memory", host: "lowmem", status: unhealthy, reason: ReasonLowMemoryAvailable},
		{name: "PSI alone on a roomy node", host: "pressure", status: healthy, reason: ReasonNoMemoryPressure},
		{name: "healthy", host: "healthy", status: healthy, reason: ReasonNoMemoryPressure},
		{name: "a short spike (avg10 high, avg60 low) is not sustained pressure", host: "pressure-lowmem",
			psi:    "some avg10=80.00 avg60=5.00 avg300=1.00 total=1\nfull avg10=70.00 avg60=4.00 avg300=1.00 total=1\n",
			status: healthy, reason: ReasonNoMemoryPressure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host := filepath.Join("testdata", "hosts", tt.host)
			if tt.psi != "" {
				root := t.TempDir()
				data, err := os.ReadFile(filepath.Join(host, "proc/meminfo"))
				if err != nil {
					t.Fatal(err)
				}
				writeFiles(t, root, map[string]string{"proc/meminfo": string(data), "proc/pressure/memory": tt.psi})
				host = root
			}
			c, err := New(Config{HostRoot: host, Logger: discardLogger(), OneShot: true})
			if err != nil {
				t.Fatal(err)
			}
			res := c.Check(context.Background())
			if res.Status != tt.status || res.Reason != tt.reason {
				t.Fatalf("got %s/%s (%s), want %s/%s", res.Status, res.Reason, res.Message, tt.status, tt.reason)
			}
			if strings.Contains(res.Message, "unless readings change") {
				t.Errorf("one-shot message promises a future change: %q", res.Message)
			}
			for _, m := range tt.msg {
				if !strings.Contains(res.Message, m) {
					t.Errorf("message %q lacks %q", res.Message, m)
				}
			}
			var names []string
			for _, in := range res.Inputs {
				names = append(names, in.Name)
			}
			if !slices.Contains(names, "MemAvailable") {
				t.Errorf("inputs %v lack MemAvailable", names)
			}
		})
	}
}

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOOMKills: growth of the kernel's oom_kill counter is named in the message for the
// window and exposed through OOMKills; a host without the counter just omits it.
func TestOOMKills(t *testing.T) {
	root := t.TempDir()
	clk := testingclock.NewFakePassiveClock(t0)
	c, err := New(Config{HostRoot: root, Now: clk.Now, Logger: discardLogger(), OOMKillWindow: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	check := func(advance time.Duration, vmstat string) collectors.Result {
		t.Helper()
		clk.SetTime(clk.Now().Add(advance))
		writeHost(t, root, step{availPc: 50})
		path := filepath.Join(root, "proc/vmstat")
		if vmstat == "" {
			_ = os.Remove(path)
		} else {
			writeFiles(t, root, map[string]string{"proc/vmstat": vmstat})
		}
		return c.Check(context.Background())
	}
	if _, ok := c.OOMKills(); ok {
		t.Fatal("OOMKills readable before any check")
	}
	res := check(0, "pgfault 1\noom_kill 3\n")
	if strings.Contains(res.Message, "OOM killer") {
		t.Errorf("kills from before the agent started named as recent: %q", res.Message)
	}
	if n, ok := c.OOMKills(); !ok || n != 3 {
		t.Errorf("OOMKills = %d, %v; want 3, true", n, ok)
	}
	res = check(10*time.Second, "pgfault 1\noom_kill 5\n")
	if want := "kernel OOM killer killed 2 process(es) in the last 5m0s, latest seen 0s ago (vmstat oom_kill 5)"; !strings.Contains(res.Message, want) {
		t.Errorf("message %q lacks %q", res.Message, want)
	}
	if res.Status != healthy {
		t.Errorf("an OOM kill alone changed the verdict: %s/%s", res.Status, res.Reason)
	}
	res = check(time.Minute, "oom_kill 6\n")
	if want := "killed 3 process(es) in the last 5m0s, latest seen 0s ago"; !strings.Contains(res.Message, want) {
		t.Errorf("message %q lacks %q", res.Message, want)
	}
	res = check(4*time.Minute+30*time.Second, "oom_kill 6\n")
	if want := "killed 1 process(es) in the last 5m0s, latest seen 4m30s ago"; !strings.Contains(res.Message, want) {
		t.Errorf("message %q lacks %q", res.Message, want)
	}
	res = check(time.Minute, "oom_kill 6\n")
	if strings.Contains(res.Message, "OOM killer") {
		t.Errorf("kills older than the window still named: %q", res.Message)
	}
	res = check(time.Second, "")
	if res.Status != healthy || res.Err != nil {
		t.Errorf("missing /proc/vmstat: %s err=%v, want healthy without error", res.Status, res.Err)
	}
}

// TestOOMVictimsNamed: when the kernel's oom_kill counter grows, the kills are put on the
// cgroups whose own counters grew since the previous walk (fixtures in
// testdata/oom-cgroups: a "before" and an "after" tree of the host's /sys/fs/cgroup). On
// cgroup v2 the counters are hierarchical, so a container whose cgroup is already gone is put
// on its pod; on cgroup v1 (Amazon Linux 2) each cgroup counts its own kills. A kill in the
// kubelet's unit is marked as the kubelet's.
func TestOOMVictimsNamed(t *testing.T) {
	for _, tc := range []struct {
		name, fixture string
		vmstat        [2]string
		want          string
	}{
		{
			name: "cgroup v2, systemd driver", fixture: "v2", vmstat: [2]string{"oom_kill 1\n", "oom_kill 5\n"},
			want: "kernel OOM killer killed 4 process(es) in the last 10m0s, latest seen 0s ago (vmstat oom_kill 5), in cgroups: " +
				"pod 3f1c2a9e-8b7d-4c5e-9f00-1a2b3c4d5e6f container 0a1b2c3d4e5f ×2, pod 11111111-2222-3333-4444-555555555555 ×1, kubelet.service (the kubelet) ×1",
		},
		{
			name: "cgroup v1, cgroupfs driver", fixture: "v1", vmstat: [2]string{"oom_kill 7\n", "oom_kill 10\n"},
			want: "killed 3 process(es) in the last 10m0s, latest seen 0s ago (vmstat oom_kill 10), in cgroups: " +
				"pod 3f1c2a9e-8b7d-4c5e-9f00-1a2b3c4d5e6f container 0a1b2c3d4e5f ×2, kubelet.service (the kubelet) ×1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			clk := testingclock.NewFakePassiveClock(t0)
			c, err := New(Config{HostRoot: root, Now: clk.Now, Logger: discardLogger()})
			if err != nil {
				t.Fatal(err)
			}
			cgroup := filepath.Join(root, "sys/fs/cgroup")
			for i, phase := range []string{"before", "after"} {
				if err := os.RemoveAll(cgroup); err != nil {
					t.Fatal(err)
				}
				if err := os.CopyFS(filepath.Join(root, "sys/fs"), os.DirFS(filepath.Join("testdata/oom-cgroups", tc.fixture+"-"+phase, "sys/fs"))); err != nil {
					t.Fatal(err)
				}
				clk.SetTime(clk.Now().Add(10 * time.Second))
				writeHost(t, root, step{availPc: 50})
				writeFiles(t, root, map[string]string{"proc/vmstat": tc.vmstat[i]})
				res := c.Check(context.Background())
				if i == 0 && strings.Contains(res.Message, "OOM killer") {
					t.Fatalf("kills from before the agent started named: %q", res.Message)
				}
				if i == 1 && !strings.Contains(res.Message, tc.want) {
					t.Fatalf("message\n  %s\nwant it to contain\n  %s", res.Message, tc.want)
				}
			}
		})
	}
}

func TestDescribeCgroup(t *testing.T) {
	for in, want := range map[string]string{
		"system.slice/kubelet.service":                                                                                "kubelet.service",
		"kubepods.slice/kubepods-pod0b5e4c1a_1111_2222_3333_444444444444.slice":                                       "pod 0b5e4c1a-1111-2222-3333-444444444444",
		"kubepods/besteffort/pod0b5e4c1a-1111-2222-3333-444444444444/abcdef0123456789abcdef0123456789":                "pod 0b5e4c1a-1111-2222-3333-444444444444 container abcdef012345",
		"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podX.slice/cri-containerd-0123456789abcd.scope": "pod X container 0123456789ab",
		"user.slice/user-1000.slice/session-3.scope":                                                                  "user.slice/user-1000.slice/session-3.scope",
	} {
		if got := describeCgroup(in); got != want {
			t.Errorf("describeCgroup(%q) = %q, want %q", in, got, want)
		}
	}
}
