// Package testbin builds nodevigil's own binaries and runs them as real processes for the
// end-to-end tests, with their output captured for failure messages. Tests exercise the
// binaries exactly as a DaemonSet or Deployment would run them: flags, signals, exit codes.
package testbin

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles the main package pkg (an import path) into dir and returns the binary's path.
// With race set the binary is built with the race detector, so races inside the process under
// test fail loudly in its log.
func Build(ctx context.Context, pkg, dir string, race bool) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	} else {
		// -trimpath as the container images build (build/images): the same compiled
		// dependencies serve both, so a cold `make test` compiles them once.
		args = append(args, "-trimpath")
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	if !race {
		// Static, as `make build` and the container images build it: no libc pages in RSS.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", pkg, err, stderr.String())
	}
	return out, nil
}

// Process is a running binary under test.
type Process struct {
	Name string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error
}

// Start runs path with args and env (added to the test's environment). The process is killed
// if the test binary dies, and its combined output is kept for Log.
func Start(name, path string, args []string, env ...string) (*Process, error) {
	p := &Process{Name: name, log: &syncBuffer{}, done: make(chan struct{})}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = p.log
	cmd.Stderr = p.log
	if err := StartTied(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p.cmd = cmd
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits up to grace for a clean exit, then SIGKILLs. It returns the
// process's exit error when it exited on SIGTERM (nil for a clean, graceful shutdown).
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s did not stop within %s of SIGTERM", p.Name, grace)
}

// Kill ends the process at once, as the OOM killer or a node crash would.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Log returns the process's output so far.
func (p *Process) Log() string { return p.log.String() }

// LogTail returns the last n lines of the output.
func (p *Process) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.log.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// HTTPStatus GETs url with a short timeout and returns the status code, or 0 when the request
// failed: probes of /healthz and /readyz in tests.
func HTTPStatus(ctx context.Context, url string) int {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// BuildTemp builds pkg with the race detector into a new temporary directory, for a test
// package's TestMain; cleanup removes the directory.
func BuildTemp(ctx context.Context, pkg string) (path string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "nodevigil-testbin-")
	if err != nil {
		return "", nil, fmt.Errorf("create build dir: %w", err)
	}
	path, err = Build(ctx, pkg, dir, true)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return path, func() { os.RemoveAll(dir) }, nil
}
