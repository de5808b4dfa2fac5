package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/fleet"
)

// devFleet is `make run`'s simulated fleet and the HTTP endpoint fleetctl talks to.
type devFleet struct {
	fleet   *fleet.Fleet
	srv     *http.Server
	addr    string
	started time.Duration // from `up` starting to every node ready
	config  string        // the remediator's RemediatorConfig file
	// restartLeader kills the leader remediator replica (POST /restart-leader); set once the
	// replicas run.
	restartLeader func(context.Context) (string, error)
}

// fleetConfig is the fleet `make run` brings up: the default pools, make run's timings
// (kubelet Lease 20s, agent Lease 10s), agents quiet unless something is wrong.
func fleetConfig(cp *controlplane.ControlPlane, emu *ec2emu.Server, agentBin, kwokBin, dir string, term *terminal) fleet.Config {
	client, _ := cp.Client()
	// Local kubelet repair needs a system bus per real agent; without dbus-daemon the agents
	// run without one and S000 shows only its second half (replacement).
	_, err := exec.LookPath("dbus-daemon")
	localRepair := err == nil
	if !localRepair {
		slog.Warn("dbus-daemon not found: the fleet's real agents run without a system bus, so kubelet-oom is not repaired locally (apt-get install dbus to see local repair)")
	}
	return fleet.Config{
		LocalRepair: localRepair,
		Client:      client, Kubeconfig: cp.KubeconfigPath(), EC2: emu, ClusterTag: devClusterTag,
		AgentBin: agentBin, KwokBin: kwokBin, AgentNamespace: devNamespace, Dir: dir,
		Pools: fleet.DefaultPools(""), KubeletLeaseSeconds: 20, AgentLeaseDuration: 10 * time.Second,
		AgentRenewInterval: 2 * time.Second, CheckInterval: 2 * time.Second, StabilityWindow: 5 * time.Second,
		Writer: func(name string) io.WriteCloser { return term.writer(name) },
		Logger: slog.New(slog.NewTextHandler(term.writer("fleet"), nil)),
	}
}

// startFleet brings the fleet up, writes the remediator's config for it and serves fleetctl.
func startFleet(ctx context.Context, cfg fleet.Config, listen string, begun time.Time) (*devFleet, error) {
	d := &devFleet{}
	cfgPath := filepath.Join(cfg.Dir, "remediator-config.yaml")
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("fleet directory: %w", err)
	}
	// Written before the fleet starts so the defaults (agent Lease) are the fleet's own.
	f, err := fleet.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d.fleet = f
	if err := os.WriteFile(cfgPath, []byte(fleet.RemediatorConfig(f.Config(), fleet.DevTimings)), 0o600); err != nil {
		f.Stop()
		return nil, fmt.Errorf("write remediator config: %w", err)
	}
	d.config = cfgPath
	// The same config where the kubectl plugin looks for it (as the Helm chart installs it).
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "nodevigil-remediator", Namespace: cfg.AgentNamespace},
		Data: map[string]string{"remediator.yaml": fleet.RemediatorConfig(f.Config(), fleet.DevTimings)}}
	if _, err := cfg.Client.CoreV1().ConfigMaps(cfg.AgentNamespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.Stop()
		return nil, fmt.Errorf("create remediator configmap: %w", err)
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		f.Stop()
		return nil, fmt.Errorf("listen for fleetctl on %s: %w", listen, err)
	}
	d.addr = l.Addr().String()
	d.srv = &http.Server{Handler: d.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.srv.Serve(l) }()
	if err := f.WaitReady(ctx, 90*time.Second); err != nil {
		d.stop()
		return nil, err
	}
	d.started = time.Since(begun)
	return d, nil
}

func (d *devFleet) stop() {
	if d.srv != nil {
		_ = d.srv.Close()
	}
	d.fleet.Stop()
}

// handler serves fleetctl: POST /fault?kind=K&target=T, POST /heal?target=T, GET /nodes.
func (d *devFleet) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /fault", func(w http.ResponseWriter, r *http.Request) {
		kind, target := r.URL.Query().Get("kind"), r.URL.Query().Get("target")
		if err := d.fleet.Inject(r.Context(), kind, target); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f, _ := fleet.LookupFault(kind)
		fmt.Fprintf(w, "%s on %s: %s\nexpect: %s\n", kind, target, f.Does, expectation(kind))
	})
	mux.HandleFunc("POST /heal", func(w http.ResponseWriter, r *http.Request) {
		target := r.URL.Query().Get("target")
		if err := d.fleet.Heal(r.Context(), target); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s healed: kubelet and agent back, host root healthy\n", target)
	})
	mux.HandleFunc("POST /restart-leader", func(w http.ResponseWriter, r *http.Request) {
		if d.restartLeader == nil {
			http.Error(w, "the remediator replicas are not running yet", http.StatusServiceUnavailable)
			return
		}
		killed, err := d.restartLeader(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "killed %s, the leader (SIGKILL: its Lease is not released); it starts again in %s as a follower\nexpect: %s\n",
			killed, restartPause, restartLeaderExpectation)
	})
	mux.HandleFunc("GET /nodes", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "%-18s %-8s %-11s %-20s %s\n", "NODE", "POOL", "ZONE", "INSTANCE", "AGENT")
		for _, n := range d.fleet.Nodes() {
			agent := "simulated"
			if n.Real {
				agent = "real (host root " + n.HostRoot() + ")"
			}
			fmt.Fprintf(w, "%-18s %-8s %-11s %-20s %s\n", n.Name, n.Pool, n.Zone, n.InstanceID, agent)
		}
	})
	return mux
}

// expectation says what a user should see after a fault, and when, with make run's timings
// (kube-controller-manager grace 20s, kubelet Lease 20s, agent Lease 10s, DevTimings).
func expectation(kind string) string {
	t := fleet.DevTimings
	switch kind {
	case "kubelet-oom":
		return "KubeletHealthy=False (KubeletOOMKilled) within ~2s and a KubeletRestarted Event: the real agent restarts the unit, " +
			"the kubelet is back before its Lease goes stale, and the remediator touches nothing although the condition stays False for 10 minutes " +
			"(on a simulated-agent node nothing restarts it: as kubelet-dead)"
	case "kubelet-dead":
		return fmt.Sprintf("KubeletHealthy=False at once, local repair fails, Ready=Unknown after ~20s; "+
			"general: KubeletUnhealthy after ~25s, cordoned %s later, drained (a dead kubelet never confirms its pods gone: the %s drain timeout, then Proceed), "+
			"terminated ~%s after the fault and a replacement joins; kafka: cordoned only",
			t.KubeletUnhealthy, t.DrainTimeout, (25*time.Second + t.KubeletUnhealthy + t.DrainTimeout).Round(time.Second))
	case "node-silent":
		return fmt.Sprintf("Ready=Unknown after ~20s; NodeSilent once both Leases expire (~25s); "+
			"general: cordoned %s later, drained (up to %s), terminated ~%s after the fault and replaced; kafka: cordoned only, never terminated",
			t.SilentNode, t.DrainTimeout, (25*time.Second + t.SilentNode + t.DrainTimeout).Round(time.Second))
	case "agent-crash":
		return "AgentSilent after ~13s (Event, metric); the node is never cordoned or terminated (it does count towards its zone's pause threshold)"
	case "cni-break":
		return fmt.Sprintf("NetworkingReady=False within ~2s; general: ConditionUnhealthy, cordoned after %s, terminated after the drain and replaced; kafka: reported only", t.NetworkingReady)
	case "memory-pressure":
		return "MemoryHealthy=False within ~2s; reported, not remediated (no pool lists MemoryHealthy)"
	case "bad-taint":
		return "KubeletConfigValid=False within ~2s, reason StartupTaintMalformed, naming the drop-in, its line and the fix"
	case "spot-notice":
		return fmt.Sprintf("NoSpotInterruption=False within the agent's spot polling interval; the remediator checks EC2 (a spot instance: believed), "+
			"cordons and drains it at once (no toleration, outside maxInFlight: AWS has decided); AWS reclaims the instance %s after the notice "+
			"and a replacement joins (kafka runs on demand: no spot notices there)", fleet.DefaultSpotNoticeWarning)
	case "maintenance":
		return fmt.Sprintf("a system-reboot %s out, seen within ~1m (the remediator's DescribeInstanceStatus poll; a real agent's metadata poll too); "+
			"general: cordoned at once (scheduledReboot CordonOnly, inside its 1h lead time), one pool slot; kafka: Notify, an Event and nothing else; "+
			"heal cancels it and general's node is uncordoned", fleet.MaintenanceLead)
	case "zone-dark":
		return "every node of the zone Ready=Unknown after ~20s, NodeSilent after ~25s; ~30s later each is blocked with ZonePaused (more than 50% of the zone silent): nothing terminated; heal the zone and it resumes"
	}
	return ""
}

// restartLeaderExpectation says what a user sees after fleetctl restart-leader (S003).
const restartLeaderExpectation = "the other replica takes the Lease within ~8s (its lease duration), watches every node's Leases " +
	"for one lease duration before judging anything, then resumes any node mid-remediation from the state on the Node: " +
	"nothing is cordoned twice or terminated twice (kubectl get lease -n " + devNamespace + " nodevigil-remediator shows the holder)"

// instructions is what `make run` prints about the fleet.
func (d *devFleet) instructions(kubeconfig, plugin string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  fleet          %d nodes in 3 zones, up in %s (kwok kubelets, EC2 emulator instances)\n",
		len(d.fleet.Nodes()), d.started.Round(100*time.Millisecond))
	b.WriteString(d.fleet.Summary())
	fmt.Fprintf(&b, "  remediator config: %s (general, spot instances: Terminate, acts on AWS events; kafka, on demand: CordonOnly, drain honours do-not-disrupt, AWS events only reported)\n\n", d.config)
	var realNode, simNode string
	for _, n := range d.fleet.Nodes() {
		if n.Real && realNode == "" && strings.HasPrefix(n.Pool, "general") {
			realNode = n.Name
		}
		if !n.Real && simNode == "" && strings.HasPrefix(n.Pool, "general") {
			simNode = n.Name
		}
	}
	b.WriteString("  break something (then: " + plugin + " --kubeconfig " + kubeconfig + " -n " + devNamespace + " explain NODE):\n")
	for _, f := range fleet.Faults {
		target := simNode
		if f.RealOnly || f.Name == "kubelet-oom" || f.Name == "kubelet-dead" {
			target = realNode
		}
		if f.Zone {
			target = "us-east-1b"
		}
		fmt.Fprintf(&b, "    go run ./integration/cmd/fleetctl fault %-15s %s\n        -> %s\n", f.Name, target, expectation(f.Name))
	}
	fmt.Fprintf(&b, "    go run ./integration/cmd/fleetctl restart-leader\n        -> %s\n", restartLeaderExpectation)
	b.WriteString("    go run ./integration/cmd/fleetctl heal NODE|ZONE      undo a fault; fleetctl nodes lists the fleet\n")
	return b.String()
}

func logFleetStop(d *devFleet) {
	if d == nil {
		return
	}
	slog.Info("stopping fleet")
	d.stop()
}
