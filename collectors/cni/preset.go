package cni

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
)

// A conflist on disk does not mean the network works: a crashed Cilium or Calico agent, or
// an aws-node whose ipamd is stuck, leaves its configuration behind, and every new pod then
// fails in CNI ADD. Presets add the CNI agent's own local health probe, the one its
// DaemonSet's readiness probe uses, so the check sees what the agent itself reports.

// Preset names, for Config.Preset.
const (
	// PresetAuto selects the presets whose plugin types appear in the default network's
	// configuration (the default when Config.Preset is empty).
	PresetAuto = "auto"
	// PresetNone checks the configuration and binaries only.
	PresetNone = "none"
	// PresetAWSVPCCNI probes ipamd of the Amazon VPC CNI (aws-node).
	PresetAWSVPCCNI = "aws-vpc-cni"
	// PresetCilium probes cilium-agent.
	PresetCilium = "cilium"
	// PresetCalico probes Felix of calico-node.
	PresetCalico = "calico"
)

// probeKind is how an agent is asked.
type probeKind int

const (
	// probeHTTP: GET, healthy on 2xx.
	probeHTTP probeKind = iota + 1
	// probeGRPCHealth: grpc.health.v1.Health/Check for the server's overall health (service
	// ""), healthy when SERVING.
	probeGRPCHealth
)

// probe is one way of asking a CNI agent whether it is healthy.
type probe struct {
	kind probeKind
	// url is the HTTP URL (probeHTTP).
	url string
	// header is sent with an HTTP probe.
	header http.Header
	// network is "unix" or "tcp" (probeGRPCHealth).
	network string
	// address is a host path for "unix" (resolved under HostRoot), host:port for "tcp".
	address string
	// ifSocketExists makes the probe apply only when its unix socket exists on the host:
	// the next probe in the preset is the fallback for older agent versions.
	ifSocketExists bool
	// fallback marks the probe used because the preferred socket is not visible. A refused
	// connection then cannot tell "agent down" from "socket not mounted into the agent",
	// so it is reported as Unknown rather than Unhealthy.
	fallback bool
	// hint is appended to an Unknown fallback result.
	hint string
}

// String names the endpoint for messages.
func (p probe) String() string {
	switch p.kind {
	case probeGRPCHealth:
		if p.network == "unix" {
			return "gRPC health unix://" + p.address
		}
		return "gRPC health " + p.address
	default:
		return p.url
	}
}

// preset is a known CNI with its agent's local health probes.
type preset struct {
	name string
	// agent names the daemon for messages.
	agent string
	// types are the plugin types that identify the CNI in a network configuration.
	types []string
	// probes are tried in order; the first that applies is used.
	probes []probe
}

// presets are the CNIs this check knows. Each port and path is the one the project's own
// DaemonSet probes use; the source is cited for each.
var presets = []preset{
	{
		name:  PresetAWSVPCCNI,
		agent: "aws-node (ipamd)",
		// aws/amazon-vpc-cni-k8s misc/10-aws.conflist: plugins "aws-cni", "egress-cni"
		// (earlier "egress-v4-cni"), "portmap".
		types: []string{"aws-cni"},
		probes: []probe{
			// v1.23.0 and later: gRPC on a unix socket (pkg/ipamd/rpc_handler.go
			// ipamdGRPCSocketPath = "/var/run/aws-node/ipamd.sock", with the standard
			// health service registered; config/master/aws-k8s-cni.yaml probes it with
			// grpc-health-probe -addr=unix:///var/run/aws-node/ipamd.sock).
			{kind: probeGRPCHealth, network: "unix", address: "/var/run/aws-node/ipamd.sock", ifSocketExists: true},
			// v1.22 and earlier: the same server on TCP (pkg/ipamd/rpc_handler.go
			// ipamdgRPCaddress = "127.0.0.1:50051"; the probe used -addr=:50051).
			{kind: probeGRPCHealth, network: "tcp", address: "127.0.0.1:50051", fallback: true,
				hint: "no ipamd socket /var/run/aws-node/ipamd.sock under the host root either: ipamd is not running, or (VPC CNI v1.23 and later) " +
					"/var/run/aws-node is not mounted into the agent; mount it read-only or set the CNI preset to none"},
		},
	},
	{
		name:  PresetCilium,
		agent: "cilium-agent",
		// cilium/cilium plugins/cilium-cni: the CNI type is "cilium-cni".
		types: []string{"cilium-cni"},
		probes: []probe{
			// install/kubernetes/cilium/templates/cilium-agent/daemonset.yaml readinessProbe:
			// httpGet 127.0.0.1:{{ .Values.healthPort }}/healthz with header "brief: true";
			// pkg/defaults AgentHealthPort = 9879.
			{kind: probeHTTP, url: "http://127.0.0.1:9879/healthz", header: http.Header{"Brief": {"true"}}},
		},
	},
	{
		name:  PresetCalico,
		agent: "calico-node (Felix)",
		// projectcalico/calico cni-plugin: the CNI type is "calico".
		types: []string{"calico"},
		probes: []probe{
			// node/pkg/health/health.go: felixReadinessEp = "http://localhost:9099/readiness"
			// (FELIX_HEALTHPORT, FELIX_HEALTHHOST; felix/config/config_params.go HealthPort
			// 9099, HealthHost localhost), what `calico-node -felix-ready` asks.
			{kind: probeHTTP, url: "http://localhost:9099/readiness"},
		},
	},
}

// PresetNames lists the values Config.Preset accepts, for flag help and errors.
func PresetNames() []string {
	names := []string{PresetAuto, PresetNone}
	for _, p := range presets {
		names = append(names, p.name)
	}
	return names
}

// findPreset returns the named preset.
func findPreset(name string) (preset, bool) {
	for _, p := range presets {
		if p.name == name {
			return p, true
		}
	}
	return preset{}, false
}

// detectPresets returns the presets whose plugin types appear among types, in table order.
// Chained setups (Cilium on the VPC CNI) match several: each agent must be healthy.
func detectPresets(types []string) []preset {
	var out []preset
	for _, p := range presets {
		for _, t := range p.types {
			if slices.Contains(types, t) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// agentProbe is a probe bound to the agent it asks.
type agentProbe struct {
	agent string
	probe probe
}

// probeResult is what asking one agent gave.
type probeResult struct {
	agentProbe
	healthy bool
	// unknown is set when the probe could not tell (see probe.fallback).
	unknown bool
	detail  string // what was seen: "returned 200", "NOT_SERVING", "connection refused"
}

// selectProbe returns the first probe of p that applies on this host.
func (c *Collector) selectProbe(p preset) (probe, error) {
	for _, pr := range p.probes {
		if !pr.ifSocketExists {
			return pr, nil
		}
		_, err := resolveInRoot(c.hostRoot, strings.TrimPrefix(pr.address, "/"))
		if err == nil {
			return pr, nil
		}
		if !errors.Is(err, fs.ErrNotExist) && !isMissing(err) {
			return pr, nil // exists but unreadable: let the probe report it
		}
	}
	return p.probes[len(p.probes)-1], nil
}

// runProbe asks one agent, bounded by the check's timeout.
func (c *Collector) runProbe(ctx context.Context, ap agentProbe) probeResult {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res := probeResult{agentProbe: ap}
	switch ap.probe.kind {
	case probeGRPCHealth:
		status, err := c.grpcHealth(ctx, ap.probe)
		switch {
		case err != nil:
			res.detail = err.Error()
			if errors.Is(err, context.DeadlineExceeded) {
				res.detail = fmt.Sprintf("did not answer within %v", c.timeout)
			}
			if ap.probe.fallback && errors.Is(err, syscall.ECONNREFUSED) {
				res.unknown = true
				res.detail = "connection refused; " + ap.probe.hint
			}
		default:
			res.detail = "status " + status
			res.healthy = status == "SERVING"
		}
	default:
		code, err := c.httpGet(ctx, ap.probe.url, ap.probe.header)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			res.detail = fmt.Sprintf("did not answer within %v", c.timeout)
		case err != nil:
			res.detail = err.Error()
		default:
			res.detail = fmt.Sprintf("returned %d %s", code, http.StatusText(code))
			res.healthy = code >= 200 && code <= 299
		}
	}
	return res
}

// httpGet GETs url and returns the status code.
func (c *Collector) httpGet(ctx context.Context, url string, header http.Header) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	// Drain a little so the connection can be reused; the body itself is not judged.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, nil
}

// dialNet is the production dialer of gRPC health probes; tests replace Collector.dial to
// reach a test server in place of a fixed agent port.
func dialNet(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, address)
}

// grpcHealthStatuses are grpc.health.v1.HealthCheckResponse.ServingStatus names.
var grpcHealthStatuses = []string{"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"}

// grpcHealth makes the unary call grpc.health.v1.Health/Check with an empty request (the
// server's overall health) over cleartext HTTP/2, as grpc-health-probe does, and returns
// the serving status. The exchange is small enough to write by hand: a gRPC message is a
// 1-byte compression flag, a 4-byte big-endian length and the protobuf bytes; the
// response's only field is "status" (field 1, varint); the call's outcome is the
// grpc-status trailer. This keeps the agent free of a gRPC dependency.
func (c *Collector) grpcHealth(ctx context.Context, p probe) (string, error) {
	network, address := p.network, p.address
	if network == "unix" {
		resolved, err := resolveInRoot(c.hostRoot, strings.TrimPrefix(address, "/"))
		if err != nil {
			return "", err
		}
		address = resolved
	}
	tr := c.grpcTransport(network, address)
	host := "localhost"
	if network == "tcp" {
		host = address
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+host+"/grpc.health.v1.Health/Check",
		bytes.NewReader([]byte{0, 0, 0, 0, 0})) // uncompressed, length 0: HealthCheckRequest{service: ""}
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if err != nil {
		return "", err
	}
	grpcStatus := resp.Trailer.Get("Grpc-Status")
	if grpcStatus == "" {
		grpcStatus = resp.Header.Get("Grpc-Status") // a trailers-only response
	}
	if resp.StatusCode != http.StatusOK || grpcStatus != "0" {
		msg := resp.Trailer.Get("Grpc-Message")
		if msg == "" {
			msg = resp.Header.Get("Grpc-Message")
		}
		return "", fmt.Errorf("gRPC call failed: HTTP %d, grpc-status %q %s", resp.StatusCode, grpcStatus, msg)
	}
	return parseHealthCheckResponse(body)
}

// grpcTransport returns the cleartext HTTP/2 transport to one agent endpoint, kept across
// checks so each check costs one request on an open connection rather than a new handshake.
// A restarted agent breaks the connection; the transport dials again on the next check.
func (c *Collector) grpcTransport(network, address string) *http.Transport {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := network + " " + address
	if tr, ok := c.transports[key]; ok {
		return tr
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	dial := c.dial
	tr := &http.Transport{
		Protocols:    &protocols,
		Proxy:        nil,
		MaxIdleConns: 1,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx, network, address)
		},
	}
	if c.transports == nil {
		c.transports = map[string]*http.Transport{}
	}
	c.transports[key] = tr
	return tr
}

// parseHealthCheckResponse decodes one length-prefixed HealthCheckResponse.
func parseHealthCheckResponse(body []byte) (string, error) {
	if len(body) < 5 {
		return "", fmt.Errorf("short gRPC response (%d bytes)", len(body))
	}
	if body[0] != 0 {
		return "", errors.New("compressed gRPC response not supported")
	}
	n := binary.BigEndian.Uint32(body[1:5])
	msg := body[5:]
	if uint32(len(msg)) != n {
		return "", fmt.Errorf("gRPC message length %d, got %d bytes", n, len(msg))
	}
	status := uint64(0) // absent field: UNKNOWN
	for len(msg) > 0 {
		key, k := binary.Uvarint(msg)
		if k <= 0 {
			return "", errors.New("malformed HealthCheckResponse")
		}
		msg = msg[k:]
		switch key & 7 {
		case 0: // varint
			v, k := binary.Uvarint(msg)
			if k <= 0 {
				return "", errors.New("malformed HealthCheckResponse")
			}
			msg = msg[k:]
			if key>>3 == 1 {
				status = v
			}
		case 2: // length-delimited, skipped
			l, k := binary.Uvarint(msg)
			if k <= 0 || uint64(len(msg)-k) < l {
				return "", errors.New("malformed HealthCheckResponse")
			}
			msg = msg[k+int(l):]
		default:
			return "", fmt.Errorf("unexpected wire type %d in HealthCheckResponse", key&7)
		}
	}
	if status < uint64(len(grpcHealthStatuses)) {
		return grpcHealthStatuses[status], nil
	}
	return fmt.Sprintf("status %d", status), nil
}

// probesFor returns the agent probes that apply: the configured HealthURL alone when set,
// else those of the configured or detected presets.
func (c *Collector) probesFor(types []string) ([]agentProbe, string) {
	if c.healthURL != "" {
		return []agentProbe{{agent: "CNI agent", probe: probe{kind: probeHTTP, url: c.healthURL}}}, ""
	}
	var ps []preset
	how := ""
	switch c.preset {
	case PresetNone:
		return nil, ""
	case "", PresetAuto:
		ps = detectPresets(types)
		how = " (detected from the plugin types)"
	default:
		p, _ := findPreset(c.preset)
		ps = []preset{p}
	}
	out := make([]agentProbe, 0, len(ps))
	for _, p := range ps {
		pr, _ := c.selectProbe(p)
		out = append(out, agentProbe{agent: p.agent, probe: pr})
	}
	return out, how
}
