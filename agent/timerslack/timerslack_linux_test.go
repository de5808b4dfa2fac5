package timerslack

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary, run as a child, act as a program that calls Ensure at its
// start: it logs "<pid> <slack ns>" to the file the variable names each time it starts, then
// calls Ensure(Slack).
const helperEnv = "TIMERSLACK_TEST_LOG"

func TestMain(m *testing.M) {
	if log := os.Getenv(helperEnv); log != "" {
		os.Exit(helper(log))
	}
	os.Exit(m.Run())
}

func helper(log string) int {
	cur, err := Current()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	fmt.Fprintf(f, "%d %d\n", os.Getpid(), cur.Nanoseconds())
	_ = f.Close()
	if err := Ensure(Slack); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 4
	}
	return 0
}

// TestEnsure runs a child that calls Ensure at its start: with the kernel's default slack it
// starts again in place (same PID) with Slack; started with a slack at least as long (an
// operator's or a parent's choice), it goes on as it is and keeps that slack.
func TestEnsure(t *testing.T) {
	tests := []struct {
		name       string
		startSlack time.Duration // the slack the child is started with
		wantStarts []time.Duration
	}{
		{"the kernel's default: executed again with Slack", 50 * time.Microsecond, []time.Duration{50 * time.Microsecond, Slack}},
		{"a longer slack is kept, no second start", 20 * time.Millisecond, []time.Duration{20 * time.Millisecond}},
		{"exactly Slack: no second start", Slack, []time.Duration{Slack}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "starts")
			out, err := startChild(t, log, tc.startSlack)
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			data, err := os.ReadFile(log)
			if err != nil {
				t.Fatalf("the child never started: %v", err)
			}
			lines := strings.Fields(strings.TrimSpace(string(data)))
			var pids []string
			var got []time.Duration
			for i := 0; i+1 < len(lines); i += 2 {
				var ns int64
				if _, err := fmt.Sscan(lines[i+1], &ns); err != nil {
					t.Fatalf("start record %q: %v", data, err)
				}
				pids = append(pids, lines[i])
				got = append(got, time.Duration(ns))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.wantStarts) {
				t.Errorf("the child started with slack %v; want %v", got, tc.wantStarts)
			}
			for _, p := range pids[1:] {
				if p != pids[0] {
					t.Errorf("started again as PID %s, not in place (PID %s)", p, pids[0])
				}
			}
		})
	}
}

// startChild runs the test binary as the helper, forked from a thread whose slack is
// startSlack (the child inherits it).
func startChild(t *testing.T, log string, startSlack time.Duration) ([]byte, error) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(startSlack), 0, 0, 0); err != nil {
		t.Fatalf("set this thread's slack: %v", err)
	}
	defer func() { _ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(prev), 0, 0, 0) }()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+log)
	return cmd.CombinedOutput()
}
