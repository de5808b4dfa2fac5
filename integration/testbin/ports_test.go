package testbin

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary, started by these tests through Start, act as a process
// under test: "listen" serves its pid over HTTP on a port it picks itself, "listen2" listens
// on two ports, "exit" exits at once.
const childEnv = "NODEVIGIL_TESTBIN_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "listen", "listen2":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		if os.Getenv(childEnv) == "listen2" {
			if _, err := net.Listen("tcp", "127.0.0.1:0"); err != nil {
				os.Exit(2)
			}
		}
		pid := strconv.Itoa(os.Getpid())
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, pid) }))
	default:
		fmt.Println("exiting as asked")
		os.Exit(3)
	}
}

func startChild(t *testing.T, mode string) *Process {
	t.Helper()
	p, err := Start("child-"+mode, os.Args[0], []string{"-test.run=^$"}, childEnv+"="+mode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// TestListenAddr: the harness learns the port a child picked itself, and it is that child
// that answers there.
func TestListenAddr(t *testing.T) {
	p := startChild(t, "listen")
	addr, err := p.ListenAddr(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != strconv.Itoa(p.Pid()) {
		t.Errorf("%s answered %q, want the child's pid %d", addr, body, p.Pid())
	}
}

func TestListenAddrFails(t *testing.T) {
	for _, tc := range []struct {
		mode, want string
	}{
		{"exit", "exited before listening"},
		{"listen2", "cannot tell which"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			p := startChild(t, tc.mode)
			var addr string
			var err error
			// listen2 may be seen with one port of two: ask until the answer is final.
			deadline := time.Now().Add(time.Minute)
			for addr, err = p.ListenAddr(t.Context()); err == nil && time.Now().Before(deadline); addr, err = p.ListenAddr(t.Context()) {
				time.Sleep(10 * time.Millisecond)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ListenAddr = %q, %v; want an error with %q", addr, err, tc.want)
			}
		})
	}
}

// TestListenAddrs reads this process's own listeners, IPv4 and IPv6, and only the listening
// ones: a connected socket or a closed listener is not one.
func TestListenAddrs(t *testing.T) {
	l4, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{l4.Addr().(*net.TCPAddr).AddrPort()}
	if l6, err := net.Listen("tcp6", "[::1]:0"); err == nil { // hosts without IPv6 skip this part
		want = append(want, l6.Addr().(*net.TCPAddr).AddrPort())
		defer l6.Close()
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().(*net.TCPAddr).AddrPort()
	closed.Close()
	conn, err := net.Dial("tcp", l4.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	got, err := ListenAddrs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("ListenAddrs = %v, missing %v", got, w)
		}
	}
	local := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	for _, a := range got {
		if a == closedAddr || a == local {
			t.Errorf("ListenAddrs = %v, has %v, which does not listen", got, a)
		}
	}
	if ok, err := Listening(os.Getpid(), int(want[0].Port())); !ok || err != nil {
		t.Errorf("Listening(own port) = %v, %v", ok, err)
	}
	if ok, err := Listening(os.Getpid(), int(want[0].Port()), int(closedAddr.Port())); ok || err != nil {
		t.Errorf("Listening(own port, closed port) = %v, %v; want false", ok, err)
	}
	l4.Close()
}

// TestRefusedAddr: connections are refused, and nobody else can listen there while it is held.
func TestRefusedAddr(t *testing.T) {
	addr, release, err := RefusedAddr()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial %s: %v, want connection refused", addr, err)
	}
	if l, err := net.Listen("tcp", addr); !errors.Is(err, syscall.EADDRINUSE) {
		if l != nil {
			l.Close()
		}
		t.Errorf("listen on the held %s: %v, want address in use", addr, err)
	}
	release()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s after release: %v", addr, err)
	}
	l.Close()
}

// TestParseProcAddr: the /proc tables print each 32-bit word in host order (little-endian here:
// amd64 and arm64).
func TestParseProcAddr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"0100007F:1F90", "127.0.0.1:8080"},
		{"00000000:0050", "0.0.0.0:80"},
		{"00000000000000000000000001000000:1F90", "[::1]:8080"},
		{"0000000000000000FFFF00000100007F:0016", "127.0.0.1:22"}, // v4-mapped
	} {
		got, err := parseProcAddr(tc.in)
		if err != nil || got.String() != tc.want {
			t.Errorf("parseProcAddr(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007F:XYZ", "01007F:0050"} {
		if _, err := parseProcAddr(bad); err == nil {
			t.Errorf("parseProcAddr(%q): no error", bad)
		}
	}
}
