// Command wakeupfloor measures what a periodic wake-up costs on this machine, at minimum, for
// the agent's spot poll: processes of their own, GOMAXPROCS=1, each waking every -interval
// and doing
//
//   - idle: nothing (a Go timer fires; the floor of the runtime and the kernel);
//   - http: one GET on a kept-alive loopback connection to a server in another process
//     (net/http's client: the transport's read and write loops, no context deadline);
//   - http-deadline: the same under a context deadline (the timer the watcher sets per poll);
//   - conn: the same GET through ConnClient (conn.go; one connection, no transport
//     goroutines: the request written and the answer read in the caller's goroutine);
//   - sdk: aws-sdk-go-v2's feature/ec2/imds client, GetMetadata of spot/instance-action
//     against the EC2 emulator's metadata service (integration/ec2emu), as the watcher calls it;
//   - sdk-conn: the same SDK client over ConnClient;
//   - conn-ctx, sdk-conn-ctx: the same with ConnClient.HeaderTimeout -1 (no read deadline:
//     only the request's context deadline, whose timer exists anyway, bounds the wait);
//   - watcher: the agent's own collectors/imds Watcher on a spot instance (the spot path every
//     interval, the rebalance path every 10 s, the other paths every minute).
//
// All variants run side by side in the same window, with the server in a process of its own
// whose CPU is not counted. CPU is read from /proc/PID/stat (utime+stime, clock ticks) and
// the sum of /proc/PID/task/*/schedstat (run time in ns, times scheduled); context switches
// per thread from /proc/PID/task/*/status. So the differences between rows say how much of a
// poll's cost is the Go runtime's and the kernel's wake-up (idle), the HTTP round trip to
// another process (http), a deadline's timer (http-deadline), the SDK's middleware (sdk) and
// the watcher's own code (watcher).
//
//	go run ./integration/bench/wakeupfloor -d 3m
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sdkimds "github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/nodevigil/nodevigil/collectors/imds"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

const instanceID = "i-0123456789abcdef0"

// variants are the client modes, in the order the table prints them.
var variants = []string{"idle", "http", "http-deadline", "conn", "conn-ctx", "sdk", "sdk-conn", "sdk-conn-ctx", "watcher"}

func main() {
	role := flag.String("role", "", "internal: server or client")
	mode := flag.String("mode", "", "internal: the client's variant")
	url := flag.String("url", "", "internal: the server's base URL")
	interval := flag.Duration("interval", 2*time.Second, "wake-up interval of every variant")
	d := flag.Duration("d", 3*time.Minute, "measurement window, after -warmup")
	warmup := flag.Duration("warmup", 10*time.Second, "time before the window starts (token, first reads, heap settled)")
	only := flag.String("variants", strings.Join(variants, ","), "comma-separated variants to run")
	copies := flag.Int("copies", 1, "processes per variant (their figures are summed and divided)")
	flag.Parse()
	var err error
	switch *role {
	case "server":
		err = serve()
	case "client":
		err = client(*mode, *url, *interval)
	case "":
		err = orchestrate(strings.Split(*only, ","), *interval, *d, *warmup, *copies)
	default:
		err = fmt.Errorf("unknown -role %q", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wakeupfloor:", err)
		os.Exit(1)
	}
}

// serve answers /plain with a 404 like the metadata service's "no event" answer, and everything
// else as an emulated spot instance's metadata service. It prints its address on stdout.
func serve() error {
	emu := ec2emu.New(ec2emu.Config{})
	if err := emu.AddInstance(ec2emu.Instance{ID: instanceID, Lifecycle: ec2emu.LifecycleSpot}); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", emu.IMDSHandler(instanceID))
	mux.HandleFunc("/plain", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "Not Found", http.StatusNotFound) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	fmt.Printf("http://%s\n", ln.Addr())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}

func client(mode, url string, interval time.Duration) error {
	ctx := context.Background()
	var poll func() error
	switch mode {
	case "idle":
		poll = func() error { return nil }
	case "http", "http-deadline", "conn", "conn-ctx":
		var hc interface {
			Do(*http.Request) (*http.Response, error)
		} = &http.Client{}
		if mode == "conn" {
			hc = &ConnClient{}
		} else if mode == "conn-ctx" {
			hc = &ConnClient{HeaderTimeout: -1}
		}
		deadline := mode != "http"
		poll = func() error {
			c := ctx
			if deadline {
				var cancel context.CancelFunc
				c, cancel = context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
			}
			req, err := http.NewRequestWithContext(c, http.MethodGet, url+"/plain", nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.Body.Close()
		}
	case "sdk", "sdk-conn", "sdk-conn-ctx":
		o := sdkimds.Options{Endpoint: url, EnableFallback: aws.FalseTernary, Retryer: aws.NopRetryer{}}
		switch mode {
		case "sdk-conn":
			o.HTTPClient = &ConnClient{}
		case "sdk-conn-ctx":
			o.HTTPClient = &ConnClient{HeaderTimeout: -1}
		}
		c := sdkimds.New(o)
		poll = func() error {
			c2, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			out, err := c.GetMetadata(c2, &sdkimds.GetMetadataInput{Path: imds.PathSpot})
			if err != nil {
				var re interface{ HTTPStatusCode() int }
				if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
					return nil
				}
				return err
			}
			_, _ = io.Copy(io.Discard, out.Content)
			return out.Content.Close()
		}
	case "watcher":
		w, err := imds.New(imds.Config{Endpoint: url, SpotInterval: interval, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		w.Run(ctx)
		return nil
	default:
		return fmt.Errorf("unknown -mode %q", mode)
	}
	t := time.NewTicker(interval)
	for range t.C {
		if err := poll(); err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
	}
	return nil
}

// sample is one process's counters at one instant.
type sample struct {
	ticks      int64 // utime+stime from /proc/PID/stat
	runNS      int64 // sum over threads of schedstat's first field
	slices     int64 // sum over threads of schedstat's third field (times run on a CPU)
	threads    []thread
	voluntary  int64
	involuntry int64
}

type thread struct {
	tid                   string
	voluntary, involuntry int64
}

func orchestrate(names []string, interval, d, warmup time.Duration, copies int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	srv := exec.Command(self, "-role", "server")
	srv.Env = append(os.Environ(), "GOMAXPROCS=1")
	srv.Stderr = os.Stderr
	out, err := srv.StdoutPipe()
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return fmt.Errorf("server address: %w", err)
	}
	url := strings.TrimSpace(line)

	type proc struct {
		name string
		cmd  *exec.Cmd
		a, b sample
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	}()
	for _, n := range names {
		for range copies {
			cmd := exec.Command(self, "-role", "client", "-mode", n, "-url", url, "-interval", interval.String())
			cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "AWS_EC2_METADATA_SERVICE_ENDPOINT="+url)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Start(); err != nil {
				return err
			}
			procs = append(procs, &proc{name: n, cmd: cmd})
		}
	}
	time.Sleep(warmup)
	load0, _ := os.ReadFile("/proc/loadavg")
	for _, p := range procs {
		if p.a, err = read(p.cmd.Process.Pid); err != nil {
			return err
		}
	}
	srvA, err := read(srv.Process.Pid)
	if err != nil {
		return err
	}
	time.Sleep(d)
	for _, p := range procs {
		if p.b, err = read(p.cmd.Process.Pid); err != nil {
			return fmt.Errorf("%s exited: %w", p.name, err)
		}
	}
	srvB, err := read(srv.Process.Pid)
	if err != nil {
		return err
	}
	load1, _ := os.ReadFile("/proc/loadavg")
	wakes := float64(d) / float64(interval)
	mins := d.Minutes()
	fmt.Printf("wake-up every %v, %v window, %d process(es) per variant, GOMAXPROCS=1; load %s -> %s\n",
		interval, d, copies, first(load0), first(load1))
	fmt.Printf("%-14s %9s %9s %11s %11s %9s %9s %8s  %s\n", "variant", "mCPU", "mCPU(ss)", "µs/wake", "µs/wake(ss)", "runs/wake", "vcs/min", "ivcs/min", "voluntary switches/min per thread")
	for _, n := range names {
		var ticks, run, slices, vol, inv int64
		var per []string
		for _, p := range procs {
			if p.name != n {
				continue
			}
			ticks += p.b.ticks - p.a.ticks
			run += p.b.runNS - p.a.runNS
			slices += p.b.slices - p.a.slices
			vol += p.b.voluntary - p.a.voluntary
			inv += p.b.involuntry - p.a.involuntry
			per = append(per, perThread(p.a, p.b, mins))
		}
		c := float64(copies)
		cpuNS := float64(ticks) * 1e9 / clockTicks / c
		fmt.Printf("%-14s %9.3f %9.3f %11.0f %11.0f %9.2f %9.1f %8.1f  %s\n", n,
			cpuNS/float64(d)*1000, float64(run)/c/float64(d)*1000,
			cpuNS/1000/wakes, float64(run)/c/1000/wakes,
			float64(slices)/c/wakes, float64(vol)/c/mins, float64(inv)/c/mins, strings.Join(per, " | "))
	}
	fmt.Printf("%-14s %9.3f %9.3f %11.0f %11.0f %9.2f %9.1f %8.1f  (the server, all variants' requests)\n", "server",
		float64(srvB.ticks-srvA.ticks)*1e9/clockTicks/float64(d)*1000, float64(srvB.runNS-srvA.runNS)/float64(d)*1000,
		0.0, 0.0, 0.0, float64(srvB.voluntary-srvA.voluntary)/mins, float64(srvB.involuntry-srvA.involuntry)/mins)
	fmt.Println("mCPU: utime+stime (clock ticks); (ss): schedstat run time, ns resolution. runs/wake: times the process's threads were put on a CPU per wake-up.")
	return nil
}

// clockTicks is USER_HZ, 100 on Linux for every architecture Go supports here.
const clockTicks = 100

func first(loadavg []byte) string {
	f := strings.Fields(string(loadavg))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func perThread(a, b sample, mins float64) string {
	before := map[string]int64{}
	for _, t := range a.threads {
		before[t.tid] = t.voluntary
	}
	var rates []float64
	for _, t := range b.threads {
		rates = append(rates, float64(t.voluntary-before[t.tid])/mins)
	}
	sort.Sort(sort.Reverse(sort.Float64Slice(rates)))
	s := make([]string, len(rates))
	for i, r := range rates {
		s[i] = strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strings.Join(s, " ")
}

func read(pid int) (sample, error) {
	var s sample
	dir := fmt.Sprintf("/proc/%d", pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return s, err
	}
	// Fields after the command name in parentheses; utime and stime are fields 14 and 15.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	if len(f) < 13 {
		return s, fmt.Errorf("%s/stat: too few fields", dir)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.ticks = u + st
	tasks, err := filepath.Glob(dir + "/task/*")
	if err != nil {
		return s, err
	}
	for _, t := range tasks {
		if ss, err := os.ReadFile(t + "/schedstat"); err == nil {
			if f := strings.Fields(string(ss)); len(f) == 3 {
				r, _ := strconv.ParseInt(f[0], 10, 64)
				n, _ := strconv.ParseInt(f[2], 10, 64)
				s.runNS += r
				s.slices += n
			}
		}
		st, err := os.ReadFile(t + "/status")
		if err != nil {
			continue
		}
		th := thread{tid: filepath.Base(t)}
		for _, l := range strings.Split(string(st), "\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			switch k {
			case "voluntary_ctxt_switches":
				th.voluntary = n
			case "nonvoluntary_ctxt_switches":
				th.involuntry = n
			}
		}
		s.threads = append(s.threads, th)
		s.voluntary += th.voluntary
		s.involuntry += th.involuntry
	}
	return s, nil
}
