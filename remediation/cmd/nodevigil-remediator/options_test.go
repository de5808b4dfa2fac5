package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseOptionsDefaults(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "ops")
	o, err := parseOptions(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.namespace != "ops" || o.listenAddress != ":9737" || !o.leaderElect || o.leaseDuration != 15*time.Second ||
		o.renewDeadline != 10*time.Second || o.retryPeriod != 2*time.Second || o.kubeAPIQPS != 50 || o.kubeAPIBurst != 200 || o.dryRun.set ||
		o.firstReadyRate != 2 || o.firstReadyBurst != 10 {
		t.Errorf("defaults = %+v", o)
	}
}

func TestParseOptionsDryRunOverride(t *testing.T) {
	for _, tt := range []struct {
		args       []string
		set, value bool
	}{
		{nil, false, false},
		{[]string{"--dry-run"}, true, true},
		{[]string{"--dry-run=false"}, true, false},
	} {
		o, err := parseOptions(tt.args, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if o.dryRun.set != tt.set || o.dryRun.value != tt.value {
			t.Errorf("%v: dryRun = %+v, want set %v value %v", tt.args, o.dryRun, tt.set, tt.value)
		}
	}
}

func TestParseOptionsErrorsNameTheFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--kube-api-qps=0"}, "--kube-api-qps: 0 must be above 0"},
		{[]string{"--kube-api-burst=0"}, "--kube-api-burst"},
		{[]string{"--workers=0"}, "--workers: 0 must be at least 1"},
		{[]string{"--first-ready-rate=0"}, "--first-ready-rate: 0 must be above 0 and at most 50 per second"},
		{[]string{"--first-ready-rate=-1"}, "--first-ready-rate: -1 must be above 0"},
		{[]string{"--first-ready-rate=NaN"}, "--first-ready-rate: NaN must be above 0"},
		{[]string{"--first-ready-rate=51"}, "--first-ready-rate: 51 must be above 0 and at most 50"},
		{[]string{"--first-ready-burst=0"}, "--first-ready-burst: 0 must be at least 1"},
		{[]string{"--resync-period=1s"}, "--resync-period"},
		{[]string{"--log-level=loud"}, `--log-level: "loud" is not a level`},
		{[]string{"--log-format=xml"}, `--log-format: "xml" is not a format`},
		{[]string{"--ec2-endpoint=localhost:4566"}, "--ec2-endpoint"},
		{[]string{"--leader-elect-lease-duration=5s"}, "--leader-elect-lease-duration: 5s must be longer than --leader-elect-renew-deadline"},
		{[]string{"--leader-elect-renew-deadline=2s"}, "--leader-elect-renew-deadline"},
		{[]string{"--listen-address="}, "--listen-address"},
		{[]string{"--pprof-address=:6060"}, `--pprof-address: ":6060" is not a loopback address`},
		{[]string{"--pprof-address=0.0.0.0:6060"}, `--pprof-address: "0.0.0.0:6060" is not a loopback address`},
		{[]string{"--pprof-address=10.0.0.1:6060"}, "--pprof-address"},
		{[]string{"--pprof-address=127.0.0.1"}, "--pprof-address"},
		{[]string{"--cluster-tag-values= , "}, "cluster-tag-values"},
		{[]string{"--metrics-tls-cert-file=/c.pem"}, "--metrics-tls-cert-file: --metrics-tls-cert-file and --metrics-tls-key-file must be set together"},
		{[]string{"--metrics-secure=false", "--metrics-tls-cert-file=/c.pem", "--metrics-tls-key-file=/k.pem"}, "--metrics-tls-cert-file: is used only with --metrics-secure=true"},
		{[]string{"--dry-run=maybe"}, "dry-run"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"positional"}, `unexpected argument "positional"`},
	}
	for _, tt := range tests {
		_, err := parseOptions(tt.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseOptions(%v) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
	// Leader election timing is not checked when leader election is off.
	if _, err := parseOptions([]string{"--leader-elect=false", "--leader-elect-lease-duration=1s"}, &bytes.Buffer{}); err != nil {
		t.Errorf("timing checked with --leader-elect=false: %v", err)
	}
}

func TestRunExitCodes(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\npolicies:\n- name: a\n  nodeSelector: x=y\n- name: b\n  nodeSelector: x=z\n  maxUnhealthy: 120%\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(dir, "live.yaml")
	if err := os.WriteFile(live, []byte("apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\ndryRun: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"help", []string{"-h"}, 0, "-cluster-tag-key"},
		{"bad flag", []string{"--workers=-1"}, 2, "--workers"},
		{"bad config names the field", []string{"--config", bad}, 2, `policies[1].maxUnhealthy: "120%" is above 100%`},
		{"missing config file", []string{"--config", filepath.Join(dir, "nope.yaml")}, 2, "nope.yaml"},
		{"acting needs the cluster tag", []string{"--config", live}, 2, "--cluster-tag-key"},
		{"dry-run flag overrides the file", []string{"--config", live, "--dry-run", "--kubeconfig", filepath.Join(dir, "no-kubeconfig")}, 1, "load kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(context.Background(), tt.args, &stderr)
			if code != tt.code || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("run(%v) = %d, stderr %q; want %d and %q", tt.args, code, stderr.String(), tt.code, tt.want)
			}
		})
	}
}
