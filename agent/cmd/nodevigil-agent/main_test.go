package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/agent"
	"github.com/nodevigil/nodevigil/agent/config"
	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

type staticCheck struct{ r collectors.Result }

func (s staticCheck) Name() collectors.CheckName              { return s.r.Check }
func (s staticCheck) Check(context.Context) collectors.Result { return s.r }

// fakeBuild returns a builder serving fixed results and records that the checks were closed.
func fakeBuild(closed *bool, rs ...collectors.Result) checkBuilder {
	return func(*config.Config, *slog.Logger) ([]agent.Checker, func(), error) {
		var cs []agent.Checker
		for _, r := range rs {
			cs = append(cs, staticCheck{r})
		}
		return cs, func() { *closed = true }, nil
	}
}

func res(check collectors.CheckName, s collectors.Status, reason, msg string) collectors.Result {
	return collectors.Result{Check: check, Status: s, Reason: reason, Message: msg}
}

func TestCheckExitCodes(t *testing.T) {
	healthy := []collectors.Result{
		res("memory", collectors.StatusHealthy, "NoMemoryPressure", "fine"),
		res("kubelet", collectors.StatusHealthy, "KubeletHealthy", "fine"),
	}
	for _, tc := range []struct {
		name     string
		args     []string
		results  []collectors.Result
		wantCode int
		wantErr  string
	}{
		{"all healthy", nil, healthy, 0, ""},
		{"one unhealthy", nil, append(healthy, res("cni", collectors.StatusUnhealthy, "NoCNIConfig", "none")), 1, ""},
		{"unknown only warns", nil, append(healthy, res("cni", collectors.StatusUnknown, "CNIUnreadable", "eacces")), 0,
			"warning: could not observe cni (see each message for what is missing and the mount or flag that provides it); not counted as failures (use --strict to fail on them)"},
		{"warning is an advisory, exit 0", nil, append(healthy, res("kubelet-config", collectors.StatusWarning, "StartupTaintNotRegistered", "advice")), 0, ""},
		{"unknown with --strict fails", []string{"--strict"}, append(healthy, res("cni", collectors.StatusUnknown, "CNIUnreadable", "eacces")), 1,
			"counted as failures (--strict)"},
		{"unhealthy and unknown", nil, append(healthy, res("cni", collectors.StatusUnhealthy, "X", ""), res("kubelet-config", collectors.StatusUnknown, "Y", "")), 1, "kubelet-config"},
		{"bad output format", []string{"--output", "yaml"}, healthy, 2, `output "yaml" is not supported`},
		{"unknown flag", []string{"--bogus"}, healthy, 2, "flag provided but not defined: -bogus"},
		{"run-only flag", []string{"--node-name", "n"}, healthy, 2, "-node-name"},
		{"missing host root", []string{"--host-root", "testdata/hosts/nope"}, healthy, 2, `hostRoot "testdata/hosts/nope" is not a directory`},
		{"help", []string{"-h"}, healthy, 0, "Exit codes:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			closed := false
			args := append([]string{"check", "--host-root", "testdata/hosts/healthy"}, tc.args...)
			code := run(context.Background(), args, &stdout, &stderr, fakeBuild(&closed, tc.results...))
			if code != tc.wantCode {
				t.Errorf("exit = %d, want %d; stderr:\n%s", code, tc.wantCode, stderr.String())
			}
			if tc.wantErr != "" && !strings.Contains(stderr.String(), tc.wantErr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.wantErr)
			}
			if tc.wantErr == "" && stderr.Len() > 0 {
				t.Errorf("unexpected stderr %q", stderr.String())
			}
			if tc.wantCode != 2 && tc.name != "help" && !closed {
				t.Error("checks not closed")
			}
		})
	}
}

func TestCheckTextTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	closed := false
	code := run(context.Background(), []string{"check", "--host-root", "testdata/hosts/healthy"}, &stdout, &stderr, fakeBuild(&closed,
		res("memory", collectors.StatusHealthy, "NoMemoryPressure", "MemAvailable 5.7Gi"),
		res("kubelet-config", collectors.StatusUnhealthy, "StartupTaintMissing", "line one\nline\ttwo"),
	))
	if code != 1 {
		t.Fatalf("exit = %d", code)
	}
	want := "" +
		"CHECK           STATUS     REASON               MESSAGE\n" +
		"memory          Healthy    NoMemoryPressure     MemAvailable 5.7Gi\n" +
		"kubelet-config  Unhealthy  StartupTaintMissing  line one line two\n"
	if stdout.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", stdout.String(), want)
	}
}

func TestCheckJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	closed := false
	in := []collectors.Result{
		res("memory", collectors.StatusHealthy, "NoMemoryPressure", "fine"),
		res("cni", collectors.StatusUnknown, "CNIUnreadable", `quote " and newline`+"\n"),
	}
	in[1].Err = context.DeadlineExceeded
	code := run(context.Background(), []string{"check", "--host-root", "testdata/hosts/healthy", "--output=json"}, &stdout, &stderr, fakeBuild(&closed, in...))
	if code != 0 {
		t.Fatalf("exit = %d", code)
	}
	var got []map[string]string
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("output is not a JSON array: %v\n%s", err, stdout.String())
	}
	if len(got) != 2 {
		t.Fatalf("got %d objects", len(got))
	}
	want := map[string]string{"check": "cni", "status": "Unknown", "reason": "CNIUnreadable", "message": "quote \" and newline\n"}
	if len(got[1]) != 4 {
		t.Errorf("object has keys %v, want exactly check,status,reason,message", got[1])
	}
	for k, v := range want {
		if got[1][k] != v {
			t.Errorf("%s = %q, want %q", k, got[1][k], v)
		}
	}
}

// TestCheckOverTestdataHosts runs the real collectors over fixture host trees. There is no
// D-Bus in the fixtures, so the kubelet verdict comes from /healthz (served by the test).
func TestCheckOverTestdataHosts(t *testing.T) {
	// Off EC2: nothing answers the metadata service.
	closed := httptest.NewServer(nil)
	closed.Close()
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", closed.URL)
	healthz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer healthz.Close()
	// An AL2023 host root from the kubelet collector's fixtures: no kubelet process, the
	// unit kubelet.service with nodeadm's environment file.
	const al2023 = "../../../collectors/kubelet/testdata/hosts/al2023-env-ok"
	for _, tc := range []struct {
		name     string
		host     string
		args     []string
		wantCode int
		want     map[string]string // check -> status/reason
	}{
		{"healthy", "testdata/hosts/healthy", nil, 0, map[string]string{
			"memory": "Healthy/NoMemoryPressure", "kubelet": "Healthy/KubeletHealthy",
			"cni": "Healthy/CNIReady", "kubelet-config": "Healthy/KubeletConfigValid",
			"spot-interruption": "Unknown/IMDSUnreachable", "scheduled-events": "Unknown/IMDSUnreachable",
		}},
		// Off EC2 the exit code follows the other checks, even with --strict.
		{"healthy strict off EC2", "testdata/hosts/healthy", []string{"--strict"}, 0, map[string]string{
			"asg-lifecycle": "Unknown/IMDSUnreachable",
		}},
		{"missing plugin strict off EC2", "testdata/hosts/missing-plugin", []string{"--strict"}, 1, map[string]string{
			"cni": "Unhealthy/CNIPluginMissing",
		}},
		{"missing-plugin", "testdata/hosts/missing-plugin", nil, 1, map[string]string{
			"memory": "Healthy/NoMemoryPressure", "cni": "Unhealthy/CNIPluginMissing",
		}},
		// The config reaches the collectors: a preset probes the CNI agent (nothing listens
		// on Calico's Felix port here), the owned taint missing from the kubelet's flags is
		// an advisory unless configured otherwise, and the unit named is the one read.
		{"cni preset", "testdata/hosts/healthy", []string{"--cni-preset=calico"}, 1, map[string]string{
			"cni": "Unhealthy/CNIAgentUnhealthy",
		}},
		{"cni preset none", "testdata/hosts/healthy", []string{"--cni-preset=none"}, 0, map[string]string{
			"cni": "Healthy/CNIReady",
		}},
		{"missing owned taint is a warning", "testdata/hosts/healthy", []string{"--owned-taints=example.com/not-registered"}, 0, map[string]string{
			"kubelet-config": "Warning/StartupTaintMissing",
		}},
		{"missing owned taint is unhealthy when configured", "testdata/hosts/healthy",
			[]string{"--owned-taints=example.com/not-registered", "--missing-owned-taint-is-unhealthy"}, 1, map[string]string{
				"kubelet-config": "Unhealthy/StartupTaintMissing",
			}},
		{"default kubelet unit", al2023, []string{"--owned-taints=node.cilium.io/agent-not-ready"}, 1 /* no CNI on that host */, map[string]string{
			"kubelet-config": "Healthy/KubeletConfigValid",
		}},
		{"other kubelet unit", al2023, []string{"--owned-taints=node.cilium.io/agent-not-ready", "--kubelet-unit=kubelet-custom.service"}, 1, map[string]string{
			"kubelet-config": "Unknown/KubeletProcessNotFound",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"check", "--host-root", tc.host,
				"--kubelet-healthz-url", healthz.URL + "/healthz", "--output", "json", "--log-level", "error"}, tc.args...)
			code := run(context.Background(), args, &stdout, &stderr, buildChecks)
			if code != tc.wantCode {
				t.Errorf("exit = %d, want %d\nstdout: %s\nstderr: %s", code, tc.wantCode, stdout.String(), stderr.String())
			}
			var got []checkOutput
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("output: %v\n%s", err, stdout.String())
			}
			var order []string
			byCheck := map[string]string{}
			for _, o := range got {
				order = append(order, o.Check)
				byCheck[o.Check] = o.Status + "/" + o.Reason
			}
			if strings.Join(order, ",") != "memory,kubelet,cni,kubelet-config,spot-interruption,rebalance-recommendation,scheduled-events,asg-lifecycle" {
				t.Errorf("checks in order %v", order)
			}
			for check, want := range tc.want {
				if byCheck[check] != want {
					t.Errorf("%s = %s, want %s", check, byCheck[check], want)
				}
			}
		})
	}
}

func TestRunCommandErrors(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"run without node name", []string{"run", "--host-root", "testdata/hosts/healthy"}, 2, "nodeName is empty; set --node-name or the NODE_NAME environment variable"},
		{"default command is run", []string{"--host-root", "testdata/hosts/healthy"}, 2, "nodeName is empty"},
		{"unknown command", []string{"start"}, 2, `unknown command "start"`},
		{"lease timing", []string{"run", "--node-name", "n", "--lease-renew-interval", "50s"}, 2, "set --lease-renew-interval below 40s"},
		{"qps cap", []string{"run", "--node-name", "n", "--kube-api-qps", "20"}, 2, "kubeAPIQPS (20) must be above 0 and at most 5"},
		{"version", []string{"version"}, 0, "nodevigil-agent dev"},
		{"--version", []string{"--version"}, 0, "nodevigil-agent dev (commit "},
		{"help", []string{"help"}, 0, "Usage:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			closed := false
			code := run(context.Background(), tc.args, &stdout, &stderr, fakeBuild(&closed))
			if code != tc.wantCode {
				t.Errorf("exit = %d, want %d (stderr %s)", code, tc.wantCode, stderr.String())
			}
			if out := stdout.String() + stderr.String(); !strings.Contains(out, tc.wantOut) {
				t.Errorf("output %q lacks %q", out, tc.wantOut)
			}
		})
	}
}

func TestGOGC(t *testing.T) {
	if got := gogc(false); got != gcPercent || gcPercent >= 100 {
		t.Errorf("gogc(env unset) = %d, want %d (below the runtime's 100)", got, gcPercent)
	}
	if got := gogc(true); got != -1 {
		t.Errorf("gogc(env set) = %d, want -1 (the operator's GOGC stands)", got)
	}
}

func TestProcs(t *testing.T) {
	for _, tc := range []struct {
		current int
		envSet  bool
		want    int
	}{
		{current: 1, want: 0},
		{current: maxProcs, want: 0},
		{current: 64, want: maxProcs},
		{current: 64, envSet: true, want: 0},
	} {
		if got := procs(tc.current, tc.envSet); got != tc.want {
			t.Errorf("procs(%d, env set %v) = %d, want %d", tc.current, tc.envSet, got, tc.want)
		}
	}
}

// TestBadFlagReportedOnce: one line naming the flag, not the flag package's message plus the
// whole usage plus ours.
func TestBadFlagReportedOnce(t *testing.T) {
	var stdout, stderr bytes.Buffer
	closed := false
	code := run(context.Background(), []string{"check", "--bogus"}, &stdout, &stderr, fakeBuild(&closed))
	if code != 2 || strings.Count(stderr.String(), "bogus") != 1 || strings.Count(stderr.String(), "\n") != 1 || stdout.Len() != 0 {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and the error once on stderr", code, stdout.String(), stderr.String())
	}
}

func TestCheckExplain(t *testing.T) {
	r := res("memory", collectors.StatusUnhealthy, "MemoryPressure", "stalls")
	r.Inputs = []collectors.Input{{Name: "MemAvailable", Source: "/proc/meminfo", Value: "300Mi (3.9%)", Threshold: "critical < 389Mi"}}
	var stdout, stderr bytes.Buffer
	closed := false
	code := run(context.Background(), []string{"check", "--host-root", "testdata/hosts/healthy", "--explain"}, &stdout, &stderr,
		fakeBuild(&closed, r, res("cni", collectors.StatusHealthy, "CNIReady", "ok")))
	if code != 1 {
		t.Fatalf("exit = %d", code)
	}
	for _, want := range []string{"memory (Unhealthy/MemoryPressure) inputs:", "MemAvailable  300Mi (3.9%)  critical < 389Mi  /proc/meminfo", "cni (Healthy/CNIReady) inputs:"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("explain output lacks %q:\n%s", want, stdout.String())
		}
	}
	stdout.Reset()
	run(context.Background(), []string{"check", "--host-root", "testdata/hosts/healthy", "--explain", "--output=json"}, &stdout, &stderr, fakeBuild(&closed, r))
	if !strings.Contains(stdout.String(), `"threshold": "critical < 389Mi"`) {
		t.Errorf("json explain lacks the inputs:\n%s", stdout.String())
	}
}

// TestCheckShowsPendingAWSEvents: on an (emulated) EC2 instance with a spot notice and a
// scheduled reboot, check lists them as Warnings and exits 0 on an otherwise healthy host.
func TestCheckShowsPendingAWSEvents(t *testing.T) {
	healthz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer healthz.Close()
	emu := ec2emu.New(ec2emu.Config{})
	const id = "i-0123456789abcdef0"
	if err := emu.AddInstance(ec2emu.Instance{ID: id, Lifecycle: ec2emu.LifecycleSpot}); err != nil {
		t.Fatal(err)
	}
	emu.SetSpotInstanceAction(id, "terminate", time.Now().Add(2*time.Minute))
	nb := time.Now().Add(72 * time.Hour)
	if err := emu.AddScheduledEvent(id, ec2emu.ScheduledEvent{ID: "instance-event-0123456789abcdef0", Code: ec2emu.EventInstanceReboot,
		Description: "scheduled reboot", NotBefore: nb}); err != nil {
		t.Fatal(err)
	}
	md := httptest.NewServer(emu.IMDSHandler(id))
	defer md.Close()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"check", "--host-root", "testdata/hosts/healthy", "--imds-endpoint", md.URL,
		"--kubelet-healthz-url", healthz.URL + "/healthz", "--output", "json", "--strict"}, &stdout, &stderr, buildChecks)
	if code != 0 {
		t.Errorf("exit = %d, want 0\n%s\n%s", code, stdout.String(), stderr.String())
	}
	var got []checkOutput
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"spot-interruption": "Warning/SpotTerminate", "scheduled-events": "Warning/InstanceReboot",
		"rebalance-recommendation": "Healthy/NoEvent", "asg-lifecycle": "Healthy/NoEvent"}
	for _, o := range got {
		if w, ok := want[o.Check]; ok && o.Status+"/"+o.Reason != w {
			t.Errorf("%s = %s/%s (%s), want %s", o.Check, o.Status, o.Reason, o.Message, w)
		}
	}
}
