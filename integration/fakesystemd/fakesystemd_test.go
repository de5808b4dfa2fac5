package fakesystemd

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// connect is go-systemd talking to the stand-in the way the agent does: EXTERNAL auth over
// the socket under the host root.
func connect(t *testing.T, hostRoot string) *sddbus.Conn {
	t.Helper()
	c, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
		conn, err := godbus.Dial("unix:path=" + hostRoot + "/" + SocketPath)
		if err != nil {
			return nil, err
		}
		if err := conn.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			conn.Close()
			return nil, err
		}
		if err := conn.Hello(); err != nil {
			conn.Close()
			return nil, err
		}
		return conn, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func activeState(t *testing.T, c *sddbus.Conn) (string, string) {
	t.Helper()
	p, err := c.GetUnitPropertyContext(t.Context(), "kubelet.service", "ActiveState")
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.GetServicePropertyContext(t.Context(), "kubelet.service", "Result")
	if err != nil {
		t.Fatal(err)
	}
	return p.Value.Value().(string), r.Value.Value().(string)
}

// TestRestartJobs: go-systemd's RestartUnit waits for the stand-in's JobRemoved, which says
// "done" with the unit back up when OnRestart says so, and "failed" with the unit still
// failed when it does not.
func TestRestartJobs(t *testing.T) {
	for _, comesUp := range []bool{true, false} {
		t.Run(strconv.FormatBool(comesUp), func(t *testing.T) {
			root, err := os.MkdirTemp("", "fsd")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(root) })
			s, err := Start(Config{HostRoot: root, OnRestart: func() bool { return comesUp }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			c := connect(t, root)
			if a, r := activeState(t, c); a != "active" || r != "success" {
				t.Fatalf("at start: %s/%s, want active/success", a, r)
			}
			s.Fail("oom-kill")
			if a, r := activeState(t, c); a != "failed" || r != "oom-kill" {
				t.Fatalf("after Fail: %s/%s, want failed/oom-kill", a, r)
			}
			ch := make(chan string, 1)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if _, err := c.RestartUnitContext(ctx, "kubelet.service", "replace", ch); err != nil {
				t.Fatal(err)
			}
			var result string
			select {
			case result = <-ch:
			case <-ctx.Done():
				t.Fatal("the restart job never ended (no JobRemoved)")
			}
			want, wantState := "done", "active"
			if !comesUp {
				want, wantState = "failed", "failed"
			}
			if a, _ := activeState(t, c); result != want || a != wantState {
				t.Errorf("job %s with the unit %s, want %s with it %s", result, a, want, wantState)
			}
			if n := s.Restarts(); n != 1 {
				t.Errorf("%d restarts recorded, want 1: %v", n, s.Calls())
			}
		})
	}
}

// TestSocketPathTooLong: a host root too deep for a unix socket is refused with the reason,
// not a daemon that never listens.
func TestSocketPathTooLong(t *testing.T) {
	long := "/tmp/a-very-long-directory-name-that-goes-on-and-on-and-on-and-on-and-on-and-on-and-on"
	_, err := Start(Config{HostRoot: long})
	if err == nil {
		t.Fatal("Start took a host root whose socket path is over 107 bytes")
	}
}

// TestScriptedLifecycle: the scripts integration/agent drives (crash, operator stop, start,
// exit on its own) leave the properties systemd would, and a stop is a job seen live
// (JobNew, ListJobs, JobRemoved).
func TestScriptedLifecycle(t *testing.T) {
	root, err := os.MkdirTemp("", "fsd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	s, err := Start(Config{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := connect(t, root)
	if err := c.Subscribe(); err != nil {
		t.Fatal(err)
	}
	if s.Subscribed() != 1 {
		t.Errorf("Subscribed = %d, want 1", s.Subscribed())
	}
	svc := func(name string) any {
		t.Helper()
		p, err := c.GetServicePropertyContext(t.Context(), "kubelet.service", name)
		if err != nil {
			t.Fatal(err)
		}
		return p.Value.Value()
	}
	unit := func(name string) any {
		t.Helper()
		p, err := c.GetUnitPropertyContext(t.Context(), "kubelet.service", name)
		if err != nil {
			t.Fatal(err)
		}
		return p.Value.Value()
	}
	pid0 := svc("MainPID").(uint32)
	s.Crash("oom-kill")
	s.Crash("exit-code")
	if n, pid := svc("NRestarts").(uint32), svc("MainPID").(uint32); n != 2 || pid == pid0 || pid == 0 {
		t.Errorf("after two crashes: NRestarts %d, MainPID %d (was %d)", n, pid, pid0)
	}

	// The stop job is visible while it runs, and JobNew/JobRemoved are signalled.
	sig := make(chan *godbus.Signal, 16)
	raw, err := godbus.Dial("unix:path=" + root + "/" + SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := raw.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		t.Fatal(err)
	}
	if err := raw.Hello(); err != nil {
		t.Fatal(err)
	}
	if err := raw.AddMatchSignal(godbus.WithMatchInterface(managerIface)); err != nil {
		t.Fatal(err)
	}
	raw.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- s.Stop(1_700_000_100_000_000) }()
	deadline := time.Now().Add(10 * time.Second)
	var listed bool
	for !listed && time.Now().Before(deadline) {
		js, err := c.ListJobsContext(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		listed = len(js) == 1 && js[0].JobType == "stop" && js[0].Unit == "kubelet.service"
		time.Sleep(5 * time.Millisecond)
	}
	if !listed {
		t.Error("the stop job was never listed by ListJobs")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var names []string
	for len(names) < 2 {
		select {
		case m := <-sig:
			if m.Name == managerIface+".JobNew" || m.Name == managerIface+".JobRemoved" {
				names = append(names, m.Name)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("signals seen: %v, want JobNew and JobRemoved", names)
		}
	}
	if a := unit("ActiveState"); a != "inactive" || svc("Result") != "success" || svc("MainPID") != uint32(0) {
		t.Errorf("after stop: %v/%v pid %v", a, svc("Result"), svc("MainPID"))
	}
	if exit, stop := svc("ExecMainExitTimestamp").(uint64), unit("ActiveExitTimestamp").(uint64); stop != 1_700_000_100_000_000 || exit <= stop {
		t.Errorf("stop: ActiveExitTimestamp %d, ExecMainExitTimestamp %d; want the unit out of service before the process exits", stop, exit)
	}

	s.StartAt(1_700_000_200_000_000)
	if a, st := unit("ActiveState"), svc("ExecMainStartTimestamp"); a != "active" || st != uint64(1_700_000_200_000_000) {
		t.Errorf("after StartAt: %v, started %v", a, st)
	}
	s.ExitOnItsOwn(1_700_000_300_000_000)
	if exit, inactive := svc("ExecMainExitTimestamp").(uint64), unit("ActiveExitTimestamp").(uint64); unit("ActiveState") != "inactive" || exit >= inactive {
		t.Errorf("exit on its own: process exit %d, unit exit %d; want the process first", exit, inactive)
	}
}
