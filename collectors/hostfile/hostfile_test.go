package hostfile

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1000) // 16,000 bytes: several reads and grows
	tests := []struct {
		name    string
		path    string
		buf     []byte
		limit   int
		want    []byte
		wantErr error
	}{
		{name: "small", path: write("small", []byte("MemTotal: 1 kB\n")), limit: 64, want: []byte("MemTotal: 1 kB\n")},
		{name: "empty", path: write("empty", nil), limit: 64, want: []byte{}},
		{name: "larger than one grow", path: write("big", big), limit: len(big), want: big},
		{name: "exactly the limit", path: write("eight", []byte("12345678")), limit: 8, want: []byte("12345678")},
		{name: "one byte over the limit", path: write("nine", []byte("123456789")), limit: 8, wantErr: ErrTooLarge},
		{name: "over the limit with a roomy buffer", path: write("nine2", []byte("123456789")), buf: make([]byte, 0, 64), limit: 8, wantErr: ErrTooLarge},
		{name: "missing", path: filepath.Join(dir, "missing"), limit: 64, wantErr: fs.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Read(tt.path, tt.buf, tt.limit)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Read(%s) err = %v, want %v", tt.name, err, tt.wantErr)
				}
				var pe *fs.PathError
				if !errors.As(err, &pe) || pe.Path != tt.path {
					t.Fatalf("Read(%s) err = %#v, want a *fs.PathError naming %s", tt.name, err, tt.path)
				}
				return
			}
			if err != nil {
				t.Fatalf("Read(%s): %v", tt.name, err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("Read(%s) = %d bytes %.40q…, want %d bytes %.40q…", tt.name, len(got), got, len(tt.want), tt.want)
			}
		})
	}
}

// TestReadReusesBuffer checks the point of the buf argument: a file that fits is read into
// the caller's buffer, so a check that passes its last result back allocates nothing.
func TestReadReusesBuffer(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 512)
	got, err := Read(p, buf, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if &got[:1][0] != &buf[:1][0] {
		t.Fatal("Read allocated a new buffer for a file that fits the one it was given")
	}
	allocs := testing.AllocsPerRun(100, func() {
		if got, err = Read(p, got, 4096); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 { // the error path's PathError is never built here; 1 leaves room for the runtime
		t.Fatalf("Read with a reused buffer: %.0f allocations a read, want at most 1", allocs)
	}
}

func TestReadDirectory(t *testing.T) {
	_, err := Read(t.TempDir(), nil, 64)
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		t.Fatalf("Read of a directory: err = %v, want a *fs.PathError", err)
	}
}

func TestReadZeroLimit(t *testing.T) {
	if _, err := Read("/nonexistent", nil, 0); err == nil || !strings.Contains(err.Error(), "limit 0 must be positive") {
		t.Fatalf("Read with limit 0: err = %v, want one naming the limit", err)
	}
}
