package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// runStatus prints the fleet once, or every interval until interrupted with --watch.
func runStatus(ctx context.Context, c kubernetes.Interface, opts options, stdout, stderr io.Writer, color bool) error {
	for first := true; ; first = false {
		s, err := gather(ctx, c, opts, stderr, opts.selector)
		if err != nil {
			if !first && ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !first && opts.output != "json" {
			if color {
				fmt.Fprint(stdout, "\033[H\033[2J") // a terminal shows the latest table only
			} else {
				fmt.Fprintln(stdout)
			}
		}
		if err := printStatus(stdout, s, opts.output, color); err != nil {
			return err
		}
		if !opts.watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // Ctrl-C ends a watch normally
		case <-time.After(opts.interval):
		}
	}
}

// printStatus writes one snapshot in the requested format.
func printStatus(w io.Writer, s *snapshot, output string, color bool) error {
	views := s.views()
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		for _, v := range views {
			if err := enc.Encode(v); err != nil {
				return fmt.Errorf("write json: %w", err)
			}
		}
		return nil
	case "yaml":
		for _, v := range views {
			b, err := yaml.Marshal(v)
			if err != nil {
				return fmt.Errorf("write yaml: %w", err)
			}
			fmt.Fprintf(w, "---\n%s", b)
		}
		return nil
	}
	wide := output == "wide"
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "NAME\tPOOL\tZONE\tAGENT\tKUBELET\tREADY\tCONDITIONS\tSTARTUP-TAINTS\t" + paint("STATE", color) + "\tREASON"
	if wide {
		head += "\tPOLICY\tVERDICT\tELIGIBLE"
	}
	fmt.Fprintln(tw, head)
	for _, v := range views {
		row := []string{
			v.Name, v.Pool, dash(v.Zone), leaseAge(v.AgentLease), leaseAge(v.KubeletLease), v.Ready,
			conditionsCell(v.Conditions), dash(strings.Join(v.StartupTaints, ",")),
			paint(v.State, color), v.Reason,
		}
		if wide {
			eligible := "-"
			if !v.decision.EligibleAt.IsZero() {
				eligible = relative(v.decision.EligibleAt, s.now)
			}
			row = append(row, v.Policy, string(v.decision.Action)+"/"+v.decision.Reason, eligible)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if len(views) == 0 {
		fmt.Fprintln(w, "No nodes.")
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tPOLICY\tACTION\tNODES\tUNHEALTHY/MAX\tIN-FLIGHT/MAX")
	for _, p := range pools(views) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%d/%d\n", p.Pool, p.Policy, p.Action, p.Nodes, p.Unhealthy, p.MaxUnhealthy, p.InFlight, p.MaxInFlight)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	st := pauses(s.cfg, views)
	if st.Cluster != "" {
		fmt.Fprintf(w, "\n%s %s\n", paint("PAUSED", color), st.Cluster)
	}
	zones := make([]string, 0, len(st.Zones))
	for z := range st.Zones {
		zones = append(zones, z)
	}
	sort.Strings(zones)
	for _, z := range zones {
		fmt.Fprintf(w, "\n%s %s\n", paint("PAUSED", color), st.Zones[z])
	}
	fmt.Fprintf(w, "\nPolicies from %s. Lease ages are now − renewTime; the remediator judges by when it saw them change.\n", s.cfgSource)
	return nil
}

// leaseAge shows a heartbeat's age, marked when stale, or "-" when there is no Lease.
func leaseAge(l *leaseView) string {
	if l == nil {
		return "-"
	}
	if l.RenewTime.IsZero() {
		return "never"
	}
	age := short(time.Duration(l.AgeSeconds * float64(time.Second)))
	if l.Stale {
		return age + "(stale)"
	}
	return age
}

// conditionsCell lists the conditions that are not True, or "ok" when all are.
func conditionsCell(cs []conditionView) string {
	if len(cs) == 0 {
		return "-"
	}
	var bad []string
	for _, c := range cs {
		if c.Status != "True" {
			bad = append(bad, c.Type+"="+c.Status)
		}
	}
	if len(bad) == 0 {
		return "ok"
	}
	return strings.Join(bad, ",")
}

// short is kubectl's age format (5s, 3m10s, 2d4h).
func short(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	return duration.HumanDuration(d)
}

// relative says when t is from now: "in 2m" or "3m ago".
func relative(t, now time.Time) string {
	if t.After(now) {
		return "in " + short(t.Sub(now))
	}
	return short(now.Sub(t)) + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// paint colours a state word on a terminal.
func paint(s string, color bool) string {
	if !color {
		return s
	}
	// Every cell gets an escape of the same length (two-digit codes) so tabwriter, which
	// counts bytes, keeps the columns aligned.
	code := "39" // default colour
	switch s {
	case stateHealthy:
		code = "32" // green
	case stateTolerating, stateWaiting, stateHeld, "Marked", "Cordoned":
		code = "33" // yellow
	case stateDue, "Draining", "Terminating", "Terminated", "PAUSED":
		code = "31" // red
	case stateBlocked:
		code = "35" // magenta
	}
	return "\033[" + code + "m" + s + "\033[0m"
}
