// Command fleetctl injects faults into the simulated fleet of `make run` (see
// integration/fleet and docs/scenarios.md): it asks the running devcluster, over loopback, to
// break a node or a zone the way real nodes break, or to heal it.
//
//	fleetctl fault KIND NODE|ZONE   kubelet-oom, kubelet-dead, node-silent, agent-crash, cni-break,
//	                                memory-pressure, bad-taint (nodes); zone-dark (zones)
//	fleetctl heal NODE|ZONE
//	fleetctl restart-leader         kill the leader remediator replica (it comes back as a follower)
//	fleetctl nodes                  the fleet: pool, zone, instance, real or simulated agent
//	fleetctl faults                 every fault and what it does
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nodevigil/nodevigil/integration/fleet"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleetctl:", err)
		os.Exit(1)
	}
}

func usage() error {
	return fmt.Errorf("usage: fleetctl [--addr HOST:PORT] fault KIND NODE|ZONE | heal NODE|ZONE | restart-leader | nodes | faults")
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("fleetctl", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9738", "address of the running `make run` (devcluster up --fleet-listen)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	args = fs.Args()
	if len(args) == 0 {
		return usage()
	}
	var method, path string
	q := url.Values{}
	switch {
	case args[0] == "fault" && len(args) == 3:
		if _, ok := fleet.LookupFault(args[1]); !ok {
			var names []string
			for _, f := range fleet.Faults {
				names = append(names, f.Name)
			}
			return fmt.Errorf("unknown fault %q; one of: %s", args[1], strings.Join(names, ", "))
		}
		method, path = http.MethodPost, "/fault"
		q.Set("kind", args[1])
		q.Set("target", args[2])
	case args[0] == "heal" && len(args) == 2:
		method, path = http.MethodPost, "/heal"
		q.Set("target", args[1])
	case args[0] == "restart-leader" && len(args) == 1:
		method, path = http.MethodPost, "/restart-leader"
	case args[0] == "nodes" && len(args) == 1:
		method, path = http.MethodGet, "/nodes"
	case args[0] == "faults" && len(args) == 1:
		for _, f := range fleet.Faults {
			target := "NODE"
			if f.Zone {
				target = "ZONE"
			} else if f.RealOnly {
				target = "NODE (a real-agent node)"
			}
			fmt.Fprintf(out, "%-16s %-25s %s\n", f.Name, target, f.Does)
		}
		return nil
	default:
		return usage()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+*addr+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("is `make run` running? %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", strings.TrimSpace(string(body)))
	}
	_, err = out.Write(body)
	return err
}
