package testbin

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// spawner runs every fork on one OS thread that is locked and never released: PDEATHSIG fires
// when the *thread* that forked the child exits, and Go may retire ordinary threads at will.
var spawner = struct {
	once sync.Once
	reqs chan func()
}{reqs: make(chan func())}

// StartTied starts cmd in its own process group with PDEATHSIG set to SIGKILL, forked from a
// thread that lives as long as the test binary. So a test that panics, and therefore never runs
// its deferred teardown, still takes every child it started with it.
func StartTied(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	spawner.once.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked
			for req := range spawner.reqs {
				req()
			}
		}()
	})
	var err error
	done := make(chan struct{})
	spawner.reqs <- func() { err = cmd.Start(); close(done) }
	<-done
	return err
}
