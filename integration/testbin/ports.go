package testbin

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Ports for processes under test, without races.
//
// Picking a "free" port by listening on 127.0.0.1:0 and closing it, then handing the number to
// a child, leaves a window in which any other process on the machine (another test binary of
// the same `go test -p 4`, or an outgoing connection's ephemeral port) can take it; the child
// then fails to bind, or worse, the harness's readiness probe reaches the other process and
// takes it for the child. So:
//   - a child of ours (agent, remediator) is started with --listen-address 127.0.0.1:0 and
//     Process.ListenAddr asks the kernel which port it bound;
//   - a child that must be told its port up front (etcd, kube-apiserver) is started on free
//     ports and counted ready only once Listening says it holds them itself, and started again
//     on fresh ports when it exits with "address already in use" (integration/controlplane);
//   - an address that must refuse connections comes from RefusedAddr, which holds the port.

// ListenAddrs returns the TCP addresses on which process pid has a listening socket, read from
// /proc (the sockets of its open file descriptors, looked up in the tables of its network
// namespace). Linux only, as the rest of the harness (PDEATHSIG).
func ListenAddrs(pid int) ([]netip.AddrPort, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	fds, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		return nil, fmt.Errorf("list the sockets of pid %d: %w", pid, err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var addrs []netip.AddrPort
	for _, table := range []string{"tcp", "tcp6"} {
		found, err := listeningIn(filepath.Join(dir, "net", table), inodes)
		if err != nil && !errors.Is(err, os.ErrNotExist) { // no tcp6 without IPv6
			return nil, err
		}
		addrs = append(addrs, found...)
	}
	return addrs, nil
}

// tcpListen is the state column of a listening socket in /proc/net/tcp (TCP_LISTEN).
const tcpListen = "0A"

// listeningIn parses a /proc/net/tcp{,6} table: "sl local_address rem_address st tx:rx tr:when
// retrnsmt uid timeout inode ...", addresses as hex host-order 32-bit words and a hex port.
func listeningIn(path string, inodes map[string]bool) ([]netip.AddrPort, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var addrs []netip.AddrPort
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != tcpListen || !inodes[fields[9]] {
			continue
		}
		ap, err := parseProcAddr(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		addrs = append(addrs, ap)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return addrs, nil
}

// parseProcAddr decodes "0100007F:1F90" (127.0.0.1:8080) or its 32-hex-digit IPv6 form: the
// address is printed as 32-bit words in host byte order.
func parseProcAddr(s string) (netip.AddrPort, error) {
	host, port, ok := strings.Cut(s, ":")
	p, perr := strconv.ParseUint(port, 16, 16)
	raw, herr := hex.DecodeString(host)
	if !ok || perr != nil || herr != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad socket address %q", s)
	}
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(p)), nil
}

// Listening reports whether process pid itself holds a listening socket on every port given.
func Listening(pid int, ports ...int) (bool, error) {
	addrs, err := ListenAddrs(pid)
	if err != nil {
		return false, err
	}
	for _, port := range ports {
		if !slices.ContainsFunc(addrs, func(a netip.AddrPort) bool { return int(a.Port()) == port }) {
			return false, nil
		}
	}
	return true, nil
}

// ListenAddr waits until the process listens on a TCP port and returns the address to reach it
// (host:port; a wildcard address is given as loopback). Start the process with its listen
// address on port 0: the kernel picks a free port at bind time, and no other process can take it
// first. It fails when the process exits first, when ctx ends, or when the process listens on
// more than one port (which one would be ambiguous).
func (p *Process) ListenAddr(ctx context.Context) (string, error) {
	for {
		if exited, err := p.Exited(); exited {
			return "", fmt.Errorf("%s exited before listening (%v):\n%s", p.Name, err, p.LogTail(30))
		}
		addrs, err := ListenAddrs(p.Pid())
		switch {
		case err != nil && errors.Is(err, fs.ErrNotExist):
			// The process is gone from /proc before its exit was recorded (Exited reads what
			// the waiting goroutine saw): the next pass reports the exit.
			addrs = nil
		case err != nil:
			if exited, _ := p.Exited(); exited {
				continue // reported above
			}
			return "", err
		}
		switch len(addrs) {
		case 0:
		case 1:
			a := addrs[0]
			if a.Addr().IsUnspecified() {
				a = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), a.Port())
			}
			return a.String(), nil
		default:
			return "", fmt.Errorf("%s listens on %v: cannot tell which is the one asked for", p.Name, addrs)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s not listening: %w\n%s", p.Name, ctx.Err(), p.LogTail(30))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// RefusedAddr returns a loopback address (host:port) that refuses connections for as long as
// release is not called: a TCP socket bound to the port and never listening holds it, so no
// other process can start listening there meanwhile. For tests of "nothing listens there".
func RefusedAddr() (addr string, release func(), err error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("socket: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return "", nil, fmt.Errorf("bind 127.0.0.1:0: %w", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return "", nil, fmt.Errorf("getsockname: %w", err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), func() { syscall.Close(fd) }, nil
}
