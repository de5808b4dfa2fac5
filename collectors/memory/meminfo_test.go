package memory

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/procfs"
)

// TestParseMeminfoAgreesWithProcfs checks parseMeminfo against prometheus/procfs, which read
// the file before: on every case, both accept or both reject it, and when they accept they
// find the same MemTotal and MemAvailable. The host's own /proc/meminfo is one of the cases.
func TestParseMeminfoAgreesWithProcfs(t *testing.T) {
	host, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		in     string
		wantOK bool
	}{
		{name: "this host", in: string(host), wantOK: true},
		{name: "kernel shape", in: "MemTotal:       24683620 kB\nMemFree:         3476085 kB\nMemAvailable:   13560000 kB\nHugePages_Total:       0\n", wantOK: true},
		{name: "no final newline", in: "MemTotal: 100 kB\nMemAvailable: 40 kB", wantOK: true},
		{name: "no MemAvailable", in: "MemTotal: 100 kB\nMemFree: 40 kB\n", wantOK: true},
		{name: "value without unit", in: "MemTotal: 100\nMemAvailable: 40\n", wantOK: true},
		{name: "not a number", in: "MemTotal: lots\n"},
		{name: "no colon", in: "MemTotal: 100 kB\nthis is not meminfo\n"},
		{name: "unknown unit", in: "MemTotal: 100 MB\n"},
		{name: "too many fields", in: "MemTotal: 100 kB extra\n"},
		{name: "no value", in: "MemTotal:\n"},
		{name: "negative", in: "MemTotal: -1 kB\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMeminfo([]byte(tt.in))
			if (err == nil) != tt.wantOK {
				t.Fatalf("parseMeminfo err = %v, want ok = %v", err, tt.wantOK)
			}
			root := t.TempDir()
			if err := os.WriteFile(filepath.Join(root, "meminfo"), []byte(tt.in), 0o600); err != nil {
				t.Fatal(err)
			}
			fs, ferr := procfs.NewFS(root)
			if ferr != nil {
				t.Fatal(ferr)
			}
			want, perr := fs.Meminfo()
			if (perr == nil) != (err == nil) {
				t.Fatalf("parseMeminfo err = %v, procfs err = %v: they disagree on whether this is meminfo", err, perr)
			}
			if perr != nil {
				return
			}
			for _, f := range []struct {
				name string
				has  bool
				v    uint64
				want *uint64
			}{
				{"MemTotal", got.hasTotal, got.totalBytes, want.MemTotalBytes},
				{"MemAvailable", got.hasAvailable, got.availableBytes, want.MemAvailableBytes},
			} {
				if f.has != (f.want != nil) || (f.want != nil && f.v != *f.want) {
					t.Errorf("%s: parseMeminfo has %v, %d bytes; procfs %v", f.name, f.has, f.v, deref(f.want))
				}
			}
			if tt.name == "this host" && (!got.hasTotal || got.totalBytes == 0 || !strings.Contains(tt.in, "MemAvailable")) {
				t.Errorf("this host's /proc/meminfo parsed as %+v", got)
			}
		})
	}
}

func deref(p *uint64) any {
	if p == nil {
		return "absent"
	}
	return *p
}
