package timerslack

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Current returns the calling thread's timer slack.
func Current() (time.Duration, error) {
	ns, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("read timer slack: %w", err)
	}
	return time.Duration(ns), nil
}

// Ensure makes the process run with a timer slack of at least slack. When the calling
// thread's is already that long (the process was started with it, or Ensure executed it
// again) it returns nil. Otherwise it sets it and executes the binary again with os.Args and
// the environment, and does not return; an error means the process goes on as it was.
// Call it first thing, before the process has output anything or started any work: the new
// image starts from main again.
func Ensure(slack time.Duration) error {
	// The slack belongs to a thread: read and set it on the thread that calls execve, which
	// becomes the new image's main thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := Current()
	if err != nil {
		return err
	}
	if cur >= slack {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable to apply timer slack: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack), 0, 0, 0); err != nil {
		return fmt.Errorf("set timer slack %v: %w", slack, err)
	}
	err = unix.Exec(exe, os.Args, os.Environ())
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(cur), 0, 0, 0) // keep this thread as it was
	return fmt.Errorf("execute %s again with timer slack %v: %w", exe, slack, err)
}
