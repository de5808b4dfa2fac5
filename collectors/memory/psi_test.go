package memory

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/procfs"

	"github.com/nodevigil/nodevigil/collectors"
)

func TestParsePSI(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    psiStats
		wantErr string // substring; empty means success
	}{
		{
			name: "kernel format",
			in:   "some avg10=1.23 avg60=4.56 avg300=7.89 total=123456\nfull avg10=0.50 avg60=0.25 avg300=0.00 total=4567\n",
			want: psiStats{
				Some: psiLine{Avg10: 1.23, Avg60: 4.56, Avg300: 7.89, Total: 123456}, HasSome: true,
				Full: psiLine{Avg10: 0.5, Avg60: 0.25, Avg300: 0, Total: 4567}, HasFull: true,
			},
		},
		{
			name: "only some (cpu-style file)",
			in:   "some avg10=0.00 avg60=0.00 avg300=0.00 total=0",
			want: psiStats{HasSome: true},
		},
		{
			name: "unknown lines and keys are ignored",
			in:   "future avg10=1\nfull avg10=100.00 avg60=0.00 avg300=0.00 total=18446744073709551615 avg1=3\n",
			want: psiStats{Full: psiLine{Avg10: 100, Total: math.MaxUint64}, HasFull: true},
		},
		{name: "empty", in: "", wantErr: `no "some" or "full" line`},
		{name: "garbage", in: "hello world\n", wantErr: `no "some" or "full" line`},
		{name: "missing total", in: "full avg10=0.00 avg60=0.00 avg300=0.00\n", wantErr: "want avg10"},
		{name: "bare kind", in: "some\n", wantErr: "want avg10"},
		{name: "not key=value", in: "some avg10 0.00\n", wantErr: "not key=value"},
		{name: "duplicate line", in: "some avg10=0 avg60=0 avg300=0 total=0\nsome avg10=0 avg60=0 avg300=0 total=0\n", wantErr: "duplicate"},
		{name: "duplicate key", in: "some avg10=0 avg10=0 avg60=0 avg300=0 total=0\n", wantErr: "duplicate field"},
		{name: "bad float", in: "some avg10=abc avg60=0 avg300=0 total=0\n", wantErr: "avg10"},
		{name: "negative", in: "some avg10=-1 avg60=0 avg300=0 total=0\n", wantErr: "not a percentage"},
		{name: "over 100", in: "full avg10=100.01 avg60=0 avg300=0 total=0\n", wantErr: "not a percentage"},
		{name: "NaN", in: "full avg10=NaN avg60=0 avg300=0 total=0\n", wantErr: "not a percentage"},
		{name: "Inf", in: "full avg10=0 avg60=+Inf avg300=0 total=0\n", wantErr: "not a percentage"},
		{name: "negative total", in: "full avg10=0 avg60=0 avg300=0 total=-1\n", wantErr: "total"},
		{name: "line longer than any PSI line", in: "some " + strings.Repeat("x", 70000), wantErr: "too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePSI([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestReadKubepodsPSI(t *testing.T) {
	root := t.TempDir()
	path, _, err := (&Collector{hostRoot: root}).readKubepodsPSI()
	if path != "" || err != nil {
		t.Errorf("no cgroup: got path %q err %v, want neither", path, err)
	}

	// The systemd driver's file wins over the cgroupfs one when both exist.
	for dir, full := range map[string]string{"kubepods.slice": "7.00", "kubepods": "9.00"} {
		p := filepath.Join(root, "sys/fs/cgroup", dir, "memory.pressure")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data := "some avg10=0 avg60=0 avg300=0 total=0\nfull avg10=" + full + " avg60=0 avg300=0 total=0\n"
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path, st, err := (&Collector{hostRoot: root}).readKubepodsPSI()
	if err != nil || path != "/sys/fs/cgroup/kubepods.slice/memory.pressure" || st.Full.Avg10 != 7 {
		t.Errorf("got %q %+v %v, want the kubepods.slice file with full avg10 7", path, st, err)
	}
}

func TestIsUnsupported(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{os.ErrNotExist, true},
		{&os.PathError{Op: "read", Path: "memory.pressure", Err: syscall.EOPNOTSUPP}, true},
		{os.ErrPermission, false},
		{errors.New("parse"), false},
	} {
		if got := isUnsupported(tt.err); got != tt.want {
			t.Errorf("isUnsupported(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	if !errors.Is(errPSIUnsupported, collectors.ErrNotSupported) {
		t.Error("errPSIUnsupported must wrap collectors.ErrNotSupported")
	}
}

// renderPSI writes st back in the kernel's format, with exact float text, so that a parse of
// the output must give st again.
func renderPSI(st psiStats) string {
	var b strings.Builder
	line := func(kind string, l psiLine) {
		b.WriteString(kind)
		for _, kv := range []struct {
			k string
			v float64
		}{{"avg10", l.Avg10}, {"avg60", l.Avg60}, {"avg300", l.Avg300}} {
			b.WriteString(" " + kv.k + "=" + strconv.FormatFloat(kv.v, 'f', -1, 64))
		}
		b.WriteString(" total=" + strconv.FormatUint(l.Total, 10) + "\n")
	}
	if st.HasSome {
		line("some", st.Some)
	}
	if st.HasFull {
		line("full", st.Full)
	}
	return b.String()
}

// FuzzParsePSI checks that parsePSI never panics and that whatever it accepts is a valid PSI
// reading that survives a render/parse round trip unchanged.
func FuzzParsePSI(f *testing.F) {
	f.Add("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	f.Add("some avg10=55.20 avg60=40.00 avg300=20.00 total=123456789\nfull avg10=32.10 avg60=20.00 avg300=10.00 total=98765432\n")
	f.Add("full avg10=100 avg60=1e1 avg300=0x1p-2 total=18446744073709551615 extra=1\nnew line\n")
	f.Add("some avg10=NaN avg60=0 avg300=0 total=0")
	f.Add("some avg10=1 avg10=2")
	f.Add("")
	hosts, _ := filepath.Glob("testdata/hosts/*/proc/pressure/memory")
	more, _ := filepath.Glob("testdata/hosts/*/sys/fs/cgroup/*/memory.pressure")
	for _, p := range append(hosts, more...) {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(string(data))
		}
	}
	f.Fuzz(func(t *testing.T, in string) {
		st, err := parsePSI([]byte(in))
		if err != nil {
			if st != (psiStats{}) {
				t.Fatalf("error %v with non-zero result %+v", err, st)
			}
			return
		}
		if !st.HasSome && !st.HasFull {
			t.Fatalf("success without any line: %q", in)
		}
		for _, l := range []psiLine{st.Some, st.Full} {
			for _, v := range []float64{l.Avg10, l.Avg60, l.Avg300} {
				if math.IsNaN(v) || v < 0 || v > 100 {
					t.Fatalf("accepted out-of-range average %v from %q", v, in)
				}
			}
		}
		out := renderPSI(st)
		again, err := parsePSI([]byte(out))
		if err != nil {
			t.Fatalf("re-parse of %q (from %q): %v", out, in, err)
		}
		if again != st {
			t.Fatalf("round trip changed the reading: %+v -> %q -> %+v", st, out, again)
		}
	})
}

// TestParsePSIAgreesWithProcfs holds parsePSI, which now reads the node-wide file too, to
// prometheus/procfs, which read it before, on this host's /proc/pressure/memory and every
// fixture: where procfs parses a line, parsePSI finds the same values, and parsePSI also
// rejects the non-finite averages procfs's %f lets through (which the check rejected anyway).
func TestParsePSIAgreesWithProcfs(t *testing.T) {
	files, err := filepath.Glob("testdata/hosts/*/proc/pressure/memory")
	if err != nil || len(files) == 0 {
		t.Fatalf("no PSI fixtures: %v", err)
	}
	files = append(files, "/proc/pressure/memory")
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if errors.Is(err, fs.ErrNotExist) && f == "/proc/pressure/memory" {
				return // a kernel without PSI: the fixtures still ran
			}
			if err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "pressure"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "pressure", "memory"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			pfs, err := procfs.NewFS(root)
			if err != nil {
				t.Fatal(err)
			}
			want, perr := pfs.PSIStatsForResource("memory")
			got, err := parsePSI(data)
			finite := func(l *procfs.PSILine) bool {
				return l == nil || checkPercent(l.Avg10) == nil && checkPercent(l.Avg60) == nil && checkPercent(l.Avg300) == nil
			}
			procfsOK := perr == nil && (want.Some != nil || want.Full != nil) && finite(want.Some) && finite(want.Full)
			if (err == nil) != procfsOK {
				t.Fatalf("parsePSI err = %v; procfs %+v, err = %v: they disagree on whether this is PSI", err, want, perr)
			}
			if err != nil {
				return
			}
			for _, l := range []struct {
				name string
				has  bool
				got  psiLine
				want *procfs.PSILine
			}{{"some", got.HasSome, got.Some, want.Some}, {"full", got.HasFull, got.Full, want.Full}} {
				if l.has != (l.want != nil) {
					t.Fatalf("%s line: parsePSI has %v, procfs %v", l.name, l.has, l.want != nil)
				}
				if l.want != nil && (l.got.Avg10 != l.want.Avg10 || l.got.Avg60 != l.want.Avg60 || l.got.Avg300 != l.want.Avg300 || l.got.Total != l.want.Total) {
					t.Fatalf("%s line: parsePSI %+v, procfs %+v", l.name, l.got, *l.want)
				}
			}
		})
	}
}
