// Package hostfile reads the small host files the collectors read every check — /proc,
// /sys/fs/cgroup, CNI and kubelet configuration — with plain system calls.
//
// os.Open on Linux offers every file to the Go netpoller: two fcntl calls to make it
// non-blocking, an epoll_ctl that fails for regular and proc files, and two more fcntl calls
// to undo the first, before the first read; os.File also registers a finalizer. A check
// reads about ten such files every cycle, so on a virtual machine where each system call
// costs a microsecond or more, that is most of what reading them costs (docs/benchmarks.md,
// session 14: /proc/meminfo in 9.9 µs against 34.7 µs through os.ReadFile, on a VM where a
// bare system call takes 1.2 µs). Read does open, read until end of file, close, and nothing
// else.
package hostfile

import (
	"errors"
	"fmt"
)

// ErrTooLarge is returned when a file holds more than the caller's limit: a /proc file that
// grows past every size the kernel writes is malformed input, not something to read whole.
var ErrTooLarge = errors.New("file larger than the limit")

// Read returns the contents of the file at path, read into buf when it fits (a caller that
// reads the same file every check passes the previous result's buffer back, so a check
// allocates nothing). It reads at most limit bytes and fails with ErrTooLarge beyond that.
// Errors are *fs.PathError, so errors.Is(err, fs.ErrNotExist) and errno comparisons such as
// syscall.EOPNOTSUPP (PSI switched off) work as they do with os.ReadFile.
func Read(path string, buf []byte, limit int) ([]byte, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("hostfile: read %s: limit %d must be positive", path, limit)
	}
	return read(path, buf[:0], limit)
}
