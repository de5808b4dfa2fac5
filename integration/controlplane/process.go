package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodevigil/nodevigil/integration/testbin"
)

// process is one child the harness started. It runs in its own process group and is tied to
// the harness's life (testbin.StartTied), so that even a test binary that panics takes its
// children with it.
type process struct {
	name    string
	path    string
	args    []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// logStart is the log's size when the current run started: the log is appended to by
	// every run (a restart, a start on fresh ports), and only this run's lines say why it ended.
	logStart int64
}

func (p *process) start() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s log: %w", p.name, err)
	}
	var logStart int64
	if st, err := logf.Stat(); err == nil {
		logStart = st.Size()
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := testbin.StartTied(cmd); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.err, p.logStart = cmd, done, nil, logStart
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// pid returns the pid of the running child, or 0.
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil || p.exitedLocked() {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *process) exitedLocked() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exited reports whether the child has exited, and its error.
func (p *process) exited() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return true, errors.New("never started")
	}
	return p.exitedLocked(), p.err
}

// stop sends SIGTERM to the child's process group and SIGKILL after grace. It only ever signals
// the pid it started (as a group leader, its group is its pid).
func (p *process) stop(grace time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	pid := cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, pid)
	}
}

// logTail returns the last lines of the child's log, for error messages.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return tail(string(data), n)
}

// addressInUse reports whether the current run's log says a port it was given was taken
// ("bind: address already in use", as etcd, kube-apiserver and kube-controller-manager put it).
func (p *process) addressInUse() bool {
	p.mu.Lock()
	start := p.logStart
	p.mu.Unlock()
	data, err := os.ReadFile(p.logPath)
	if err != nil || int64(len(data)) < start {
		return false
	}
	return strings.Contains(string(data[start:]), "address already in use")
}

// waitFor polls ready until it succeeds, the child exits, or timeout; the error carries the
// tail of the child's log so a failing start explains itself.
func (p *process) waitFor(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if exited, err := p.exited(); exited {
			return fmt.Errorf("%s exited before becoming ready (%v); last log lines:\n%s", p.name, err, p.logTail(30))
		}
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v; last log lines:\n%s", p.name, timeout, last, p.logTail(30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *process) String() string {
	return p.name + " " + strings.Join(p.args, " ")
}
