package hostfile

import (
	"bytes"
	"os"
	"syscall"
	"testing"
)

// TestReadProc reads a file of size 0 that the kernel generates on read, as /proc/meminfo
// and PSI files are: it must be read to its end, not to its stat size.
func TestReadProc(t *testing.T) {
	got, err := Read("/proc/self/status", nil, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(got, []byte("\nVmRSS:")) || !bytes.HasSuffix(got, []byte("\n")) {
		t.Fatalf("/proc/self/status read as %d bytes without its VmRSS line or final newline:\n%s", len(got), got)
	}
}

// BenchmarkReadProcMeminfo reads /proc/meminfo as the memory check does every cycle, with
// Read and with os.ReadFile, beside one bare system call (getppid) for scale: on a VM where
// a system call costs a microsecond or more, the netpoller's fcntl/epoll_ctl calls that
// os.Open makes for every file are most of the difference.
func BenchmarkReadProcMeminfo(b *testing.B) {
	b.Run("hostfile.Read", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = Read("/proc/meminfo", buf, 64<<10); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("os.ReadFile", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := os.ReadFile("/proc/meminfo"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("getppid", func(b *testing.B) {
		for b.Loop() {
			syscall.Getppid()
		}
	})
}
