package memory

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestParseOOMKills(t *testing.T) {
	tests := []struct {
		name, in string
		want     uint64
		err      error // errors.Is target, or nil for "any error" when wantErr
		wantErr  bool
	}{
		{name: "counter", in: "nr_free_pages 1000\npgfault 12\noom_kill 7\nnr_unstable 0\n", want: 7},
		{name: "zero", in: "oom_kill 0\n", want: 0},
		{name: "first line", in: "oom_kill 18446744073709551615", want: 1<<64 - 1},
		{name: "missing (kernel < 4.13)", in: "nr_free_pages 1000\npgfault 12\n", wantErr: true, err: errNoOOMKill},
		{name: "empty", in: "", wantErr: true, err: errNoOOMKill},
		{name: "not a number", in: "oom_kill seven\n", wantErr: true},
		{name: "negative", in: "oom_kill -1\n", wantErr: true},
		{name: "prefix is not the counter", in: "oom_kill_total 3\n", wantErr: true, err: errNoOOMKill},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseOOMKills([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if tt.err != nil && !errors.Is(err, tt.err) {
				t.Errorf("err = %v, want %v", err, tt.err)
			}
			if err == nil && got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

func FuzzParseOOMKills(f *testing.F) {
	f.Add("oom_kill 3\n")
	f.Add("pgfault 1\noom_kill 0")
	f.Fuzz(func(t *testing.T, in string) {
		n, err := parseOOMKills([]byte(in))
		if err != nil && n != 0 {
			t.Fatalf("value %d with error %v", n, err)
		}
	})
}

func TestOOMKillsMetric(t *testing.T) {
	c, err := New(Config{HostRoot: "testdata/hosts/pressure-lowmem", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("%d metrics before the first read, want 0", n)
	}
	c.Check(context.Background())
	want := "# HELP nodevigil_memory_oom_kills_total Processes killed by the kernel OOM killer since the node booted (oom_kill in /proc/vmstat), as last read by the memory check.\n# TYPE nodevigil_memory_oom_kills_total counter\nnodevigil_memory_oom_kills_total 4\n"
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
