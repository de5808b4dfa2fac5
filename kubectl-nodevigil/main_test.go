package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		cmd     string
		pos     []string
		check   func(options) bool
		wantErr string
	}{
		{name: "status defaults", args: []string{"status"}, cmd: "status",
			check: func(o options) bool {
				return o.namespace == "nodevigil-system" && o.configMap == "nodevigil-remediator" && o.requestTimeout == 15*time.Second && o.interval == 2*time.Second
			}},
		{name: "global flags before the command", args: []string{"-n", "ops", "--context", "prod", "status", "-o", "wide"}, cmd: "status",
			check: func(o options) bool { return o.namespace == "ops" && o.context == "prod" && o.output == "wide" }},
		{name: "flags after the node", args: []string{"explain", "ip-10-0-1-5", "--namespace", "ops"}, cmd: "explain", pos: []string{"ip-10-0-1-5"},
			check: func(o options) bool { return o.namespace == "ops" }},
		{name: "hold with reason", args: []string{"hold", "n1", "--reason", "kernel upgrade"}, cmd: "hold", pos: []string{"n1"},
			check: func(o options) bool { return o.reason == "kernel upgrade" }},
		{name: "watch", args: []string{"status", "-w", "--interval", "5s", "-l", "karpenter.sh/nodepool=kafka"}, cmd: "status",
			check: func(o options) bool {
				return o.watch && o.interval == 5*time.Second && o.selector == "karpenter.sh/nodepool=kafka"
			}},
		{name: "no command", args: nil, wantErr: "no command given"},
		{name: "unknown command", args: []string{"delete", "n1"}, wantErr: `unknown command "delete"`},
		{name: "status with argument", args: []string{"status", "n1"}, wantErr: "status takes no arguments"},
		{name: "explain without node", args: []string{"explain"}, wantErr: "explain takes exactly one node name, got 0"},
		{name: "release two nodes", args: []string{"release", "a", "b"}, wantErr: "release takes exactly one node name, got 2"},
		{name: "bad output", args: []string{"status", "-o", "xml"}, wantErr: `-o "xml" is not an output format`},
		{name: "reason outside hold", args: []string{"release", "n1", "--reason", "x"}, wantErr: "--reason applies to hold only"},
		{name: "bad interval", args: []string{"status", "--interval", "0s"}, wantErr: "--interval 0s must be positive"},
		{name: "bad timeout", args: []string{"status", "--request-timeout", "-1s"}, wantErr: "--request-timeout -1s must be positive"},
		{name: "unknown flag", args: []string{"status", "--colour"}, wantErr: "flag provided but not defined: -colour"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, cmd, pos, err := parse(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if cmd != tc.cmd || strings.Join(pos, ",") != strings.Join(tc.pos, ",") {
				t.Errorf("cmd %q pos %v, want %q %v", cmd, pos, tc.cmd, tc.pos)
			}
			if tc.check != nil && !tc.check(o) {
				t.Errorf("options not as expected: %+v", o)
			}
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		stdout     string
		stderrLine string
	}{
		{[]string{"--help"}, exitOK, "Exit status: 0 success, 1 error", ""},
		{[]string{"help"}, exitOK, "kubectl nodevigil status", ""},
		{[]string{"status", "--bogus"}, exitUsage, "", "error: flag provided but not defined: -bogus"},
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig", "status"}, exitError, "", "error: kubeconfig: stat /nonexistent/kubeconfig"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errb, false)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout %q does not contain %q", out.String(), tc.stdout)
			}
			if first := strings.SplitN(errb.String(), "\n", 2)[0]; !strings.HasPrefix(first, tc.stderrLine) {
				t.Errorf("stderr first line %q, want prefix %q", first, tc.stderrLine)
			}
		})
	}
}

func TestPaintKeepsColumnsAligned(t *testing.T) {
	var lens []int
	for _, s := range []string{stateHealthy, stateDue, stateBlocked, "Something", "STATE"} {
		lens = append(lens, len(paint(s, true))-len(s))
	}
	for _, l := range lens[1:] {
		if l != lens[0] {
			t.Fatalf("escape lengths differ %v: tabwriter would misalign the columns", lens)
		}
	}
	if paint(stateDue, false) != stateDue {
		t.Error("paint without colour changed the text")
	}
}
