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
