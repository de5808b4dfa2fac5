//go:build unix

package hostfile

import (
	"fmt"
	"io/fs"
	"syscall"
)

func read(path string, buf []byte, limit int) ([]byte, error) {
	var fd int
	err := retryEINTR(func() (err error) {
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd) // read-only: close cannot lose data
	for {
		if len(buf) == cap(buf) {
			// Start at 512 bytes, which most of these files fit (comm, cmdline, PSI, a
			// conflist), and double; at most limit+1, so one byte more than allowed is seen.
			grown := make([]byte, len(buf), min(max(2*cap(buf), 512), limit+1))
			copy(grown, buf)
			buf = grown
		}
		var n int
		err := retryEINTR(func() (err error) {
			n, err = syscall.Read(fd, buf[len(buf):cap(buf)])
			return err
		})
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		if buf = buf[:len(buf)+n]; len(buf) > limit {
			return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%d bytes)", ErrTooLarge, limit)}
		}
	}
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); err != syscall.EINTR {
			return err
		}
	}
}
