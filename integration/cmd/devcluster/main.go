// Command devcluster runs nodevigil on this machine for development (it is what `make run`
// runs): `paths` finds or builds the control-plane binaries and prints where they are; `up`
// starts a local control plane, the EC2 emulator, the agent for this host and the remediator in
// dry-run, and prints how to look at them, until interrupted.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "paths":
		err = paths(ctx)
	case "kwok":
		var p string
		if p, err = controlplane.FindOrBuildKwok(ctx, controlplane.BuildConfig{}); err == nil {
			fmt.Printf("kwok                    %s\n", p)
		}
	case "up":
		err = up(ctx, os.Args[2:])
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		slog.Error("devcluster failed", "err", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: devcluster paths | kwok | up [--dir DIR] [--bin-dir DIR] [--fleet=false] [--fleet-listen ADDR]")
}

func paths(ctx context.Context) error {
	bins, err := controlplane.FindOrBuild(ctx, controlplane.BuildConfig{})
	if err != nil {
		return err
	}
	fmt.Printf("etcd                    %s\nkube-apiserver          %s\nkube-controller-manager %s\n",
		bins.Etcd, bins.APIServer, bins.ControllerManager)
	return nil
}

func up(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	dir := fs.String("dir", "", "working directory for the control plane (default: a new temporary directory, removed on exit)")
	binDir := fs.String("bin-dir", "bin", "where `make build` put nodevigil-agent and nodevigil-remediator")
	agentAddr := fs.String("agent-listen", "127.0.0.1:9736", "address of the agent's /metrics, /healthz, /readyz")
	remAddr := fs.String("remediator-listen", "127.0.0.1:9737", "address of the remediator's /metrics, /healthz, /readyz")
	remAddrB := fs.String("remediator-b-listen", "127.0.0.1:9739", "address of the second remediator replica's /metrics, /healthz, /readyz (with --fleet)")
	withFleet := fs.Bool("fleet", true, "also run a simulated fleet (kwok kubelets, real and simulated agents) and the remediator for real against the EC2 emulator")
	fleetAddr := fs.String("fleet-listen", "127.0.0.1:9738", "address fleetctl talks to (fault injection)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, b := range []string{"nodevigil-agent", "nodevigil-remediator"} {
		if _, err := os.Stat(filepath.Join(*binDir, b)); err != nil {
			return fmt.Errorf("%s not found in %s: run `make build` first (make run does): %w", b, *binDir, err)
		}
	}
	term := newTerminal(os.Stdout, "control-plane", "devcluster", "ec2-emulator", "nodevigil-agent", "nodevigil-remediator-a", "fleet", "kwok")
	own := term.writer("devcluster")
	defer own.Close()
	slog.SetDefault(slog.New(slog.NewTextHandler(own, nil)))

	cpOut := term.writer("control-plane")
	defer cpOut.Close()
	var kwokBin string
	if *withFleet {
		var err error
		if kwokBin, err = controlplane.FindOrBuildKwok(ctx, controlplane.BuildConfig{Progress: cpOut}); err != nil {
			return err
		}
	}
	begun := time.Now() // every binary is built: the start-up time counts from here
	cp, err := controlplane.Start(ctx, controlplane.Config{Dir: *dir, Progress: cpOut, Build: controlplane.BuildConfig{Progress: cpOut}})
	if err != nil {
		return err
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			slog.Error("stop control plane", "err", err)
		}
	}()

	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	host = strings.ToLower(host)
	if err := seedCluster(ctx, cp, host); err != nil {
		return err
	}

	emuOut := term.writer("ec2-emulator")
	defer emuOut.Close()
	// The emulator logs every call at Info; at Warn only failures and injected faults show, so
	// the fleet's story is not buried under DescribeInstances lines.
	emu := ec2emu.New(ec2emu.Config{Logger: slog.New(slog.NewTextHandler(emuOut, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := emu.AddInstance(ec2emu.Instance{ID: devInstanceID, Zone: devZone, Tags: map[string]string{devClusterTag: "owned"}}); err != nil {
		return err
	}
	if err := emu.Start(); err != nil {
		return fmt.Errorf("start EC2 emulator: %w", err)
	}
	defer emu.Close()

	var fl *devFleet
	var kwokExited <-chan error
	remMode := []string{"--dry-run"}
	if *withFleet {
		fl, err = startFleet(ctx, fleetConfig(cp, emu, filepath.Join(*binDir, "nodevigil-agent"), kwokBin,
			filepath.Join(cp.Dir(), "fleet"), term), *fleetAddr, begun)
		if err != nil {
			return err
		}
		defer logFleetStop(fl)
		kwokExited = fl.fleet.KwokExited()
		remMode = []string{"--config", fl.config}
	}
	agent, err := startChild(term, "nodevigil-agent", filepath.Join(*binDir, "nodevigil-agent"), []string{"run",
		"--node-name", host, "--namespace", devNamespace, "--pod-name", "nodevigil-agent-" + host,
		"--kubeconfig", cp.KubeconfigPath(), "--host-root", "/", "--listen-address", *agentAddr,
		"--log-format", "text",
	})
	if err != nil {
		return err
	}
	defer stopChild("nodevigil-agent", agent)
	remArgs := append([]string{"--kubeconfig", cp.KubeconfigPath(), "--namespace", devNamespace}, remMode...)
	remArgs = append(remArgs, "--metrics-secure=false", "--ec2-endpoint", emu.URL(), "--aws-region", "us-east-1",
		"--cluster-tag-key", devClusterTag, "--log-format", "text")
	remEnv := []string{"AWS_ACCESS_KEY_ID=devcluster", "AWS_SECRET_ACCESS_KEY=devcluster", "AWS_CA_BUNDLE="}
	client, err := cp.Client()
	if err != nil {
		return err
	}
	rems := newReplicaSet(term, filepath.Join(*binDir, "nodevigil-remediator"), client, devNamespace)
	defer rems.stop()
	remText := fmt.Sprintf("metrics http://%s/metrics", *remAddr)
	if fl == nil {
		if err := rems.start("nodevigil-remediator", *remAddr, remArgs, remEnv); err != nil {
			return err
		}
	} else {
		// Two replicas, as the chart runs them, with leader election quick enough to watch
		// (fleetctl restart-leader; scenario S003).
		remArgs = append(remArgs, "--leader-elect-lease-duration", "8s", "--leader-elect-renew-deadline", "6s", "--leader-elect-retry-period", "1s")
		for _, r := range []struct{ name, listen string }{{"nodevigil-remediator-a", *remAddr}, {"nodevigil-remediator-b", *remAddrB}} {
			if err := rems.start(r.name, r.listen, remArgs, remEnv); err != nil {
				return err
			}
		}
		fl.restartLeader = rems.restartLeader
		remText = fmt.Sprintf("2 replicas (one leader), metrics http://%s/metrics and http://%s/metrics", *remAddr, *remAddrB)
	}

	remModeText, fleetText := "dry-run", ""
	if fl != nil {
		remModeText = "acting on the EC2 emulator (config " + fl.config + ")"
		fleetText = "\n" + fl.instructions(cp.KubeconfigPath(), filepath.Join(*binDir, "kubectl-nodevigil")) +
			"  (docs/scenarios.md walks through each one)\n" +
			fmt.Sprintf("  Draw one remediation, Events and the remediators' metrics on one time axis (start it before\n"+
				"  the fault; Ctrl-C draws once the node is replaced):\n"+
				"    go run ./integration/cmd/timeline --kubeconfig %s --node NODE \\\n"+
				"        --metrics-url http://%s/metrics,http://%s/metrics --out timeline.svg\n",
				cp.KubeconfigPath(), *remAddr, *remAddrB)
	}
	term.block(fmt.Sprintf(`
nodevigil is running locally:
  control plane  %[1]s (kube-apiserver, etcd, kube-controller-manager)
  EC2 emulator   %[2]s (instance %[3]s)
  agent          node %[4]q, metrics http://%[5]s/metrics
  remediator     %[10]s, %[6]s

  kubeconfig: %[7]s
  try:  kubectl --kubeconfig %[7]s get node %[4]s -o yaml
        kubectl --kubeconfig %[7]s get events -A
        %[8]s --kubeconfig %[7]s -n %[9]s status          (and: explain %[4]s)
        curl -s http://%[5]s/metrics | grep nodevigil_
  The agent runs against this machine's real /proc and CNI directories. There is no kubelet
  here, so the Node turns Ready=Unknown and the agent says what it sees (KubeletHealthy,
  NetworkingReady); the remediator records what it would do about it (its policy for this
  node only reports).
%[11]sEvery line below is prefixed with the process that wrote it. Ctrl-C stops everything.
`, cp.URL(), emu.URL(), devInstanceID, host, *agentAddr, remText, cp.KubeconfigPath(),
		filepath.Join(*binDir, "kubectl-nodevigil"), devNamespace, remModeText, fleetText))

	select {
	case <-ctx.Done():
		return nil
	case err := <-kwokExited:
		return fmt.Errorf("kwok exited: %w", err)
	case err := <-agent.exited:
		return fmt.Errorf("nodevigil-agent exited: %w", err)
	case err := <-rems.exited:
		return err
	}
}

const (
	devNamespace  = "nodevigil-system"
	devZone       = "us-east-1a"
	devInstanceID = "i-0de5c1a5500000001"
	devClusterTag = "kubernetes.io/cluster/devcluster"
)

// seedCluster creates the agent namespace and a Node for this host, as the kubelet would have
// registered it on EC2 (with a providerID the remediator can resolve).
func seedCluster(ctx context.Context, cp *controlplane.ControlPlane, host string) error {
	client, err := cp.Client()
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: devNamespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace: %w", err)
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: host, Labels: map[string]string{
			"topology.kubernetes.io/zone": devZone, "kubernetes.io/hostname": host,
		}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///" + devZone + "/" + devInstanceID},
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", host, err)
	}
	return nil
}

type child struct {
	cmd    *exec.Cmd
	exited chan error
}

// startChild starts one of our binaries with its output prefixed by name on the terminal.
func startChild(term *terminal, name, path string, args []string, env ...string) (*child, error) {
	cmd := exec.Command(path, args...)
	out := term.writer(name)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), env...)
	if err := testbin.StartTied(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	c := &child{cmd: cmd, exited: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		_ = out.Close()
		c.exited <- err
	}()
	return c, nil
}

func stopChild(name string, c *child) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		slog.Warn("child did not stop in time; killing it", "child", name)
		_ = c.cmd.Process.Kill()
	}
}
