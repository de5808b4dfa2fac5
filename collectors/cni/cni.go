// Package cni is the CNI readiness check of nodevigil. A node whose container network is not
// set up cannot run pods even though its kubelet is healthy, and CNI startup taints must be
// removed exactly when the network is really ready, so the agent needs a precise, local
// answer to "would the runtime be able to set up a pod network now?".
//
// The check follows the rule containerd (via go-cni and libcni) applies: of the regular files
// in the configuration directory whose extension is .conf, .conflist or .json, the lexically
// first is the default network; it is used as-is, and if it is invalid the network is not
// ready (later files are not tried). The chosen file must be a JSON object with a name, a
// cniVersion and a non-empty plugin list (a .conf or .json file is a single plugin with its own
// "type"), and every plugin type must be an executable regular file in the binary directory.
// Optionally the CNI agent's own health endpoint must answer 2xx within the timeout.
//
// Paths are resolved as on the host: the host filesystem is mounted at HostRoot, and symlinks
// under it (absolute ones included) are followed relative to HostRoot.
package cni

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/hostfile"
)

// Name is the check name the CNI collector reports under.
const Name = collectors.CheckCNI

// Reasons of CNI results. They are stable: they become Node condition reasons and alert labels.
const (
	// ReasonCNIReady: the default network config is valid, its plugins are installed and the
	// agent (if configured) is healthy.
	ReasonCNIReady = "CNIReady"
	// ReasonNoCNIConfig: the configuration directory holds no .conf, .conflist or .json file
	// (or does not exist), typically because the CNI agent has not written it yet.
	ReasonNoCNIConfig = "NoCNIConfig"
	// ReasonInvalidCNIConfig: the default network config would be refused by the runtime.
	ReasonInvalidCNIConfig = "InvalidCNIConfig"
	// ReasonCNIPluginMissing: a plugin the config names is not an executable file in the
	// binary directory.
	ReasonCNIPluginMissing = "CNIPluginMissing"
	// ReasonCNIAgentUnhealthy: the CNI agent's health endpoint did not answer 2xx in time.
	ReasonCNIAgentUnhealthy = "CNIAgentUnhealthy"
	// ReasonCNIAgentUnknown: the CNI agent's health could not be observed (its socket is not
	// visible to the agent and the fallback port refused); the status is Unknown.
	ReasonCNIAgentUnknown = "CNIAgentUnknown"
	// ReasonCNIUnreadable: the check could not read the configuration or binary directory
	// (permissions, I/O error); the status is Unknown.
	ReasonCNIUnreadable = "CNIUnreadable"
	// ReasonCheckCanceled: the caller's context was done before the check finished.
	ReasonCheckCanceled = "CheckCanceled"
)

// Defaults for Config.
const (
	DefaultConfDir = "etc/cni/net.d"
	DefaultBinDir  = "opt/cni/bin"
	DefaultTimeout = 2 * time.Second
)

// maxConfigSize is the largest configuration file accepted, as containerd's go-cni does.
const maxConfigSize = 2 << 20

// Config configures the CNI check. Zero values select the defaults.
type Config struct {
	// HostRoot is where the host's filesystem is mounted in the agent's container; "/" when
	// empty.
	HostRoot string
	// ConfDir is the CNI configuration directory, relative to HostRoot; DefaultConfDir when
	// empty.
	ConfDir string
	// BinDir is the CNI plugin binary directory, relative to HostRoot; DefaultBinDir when empty.
	BinDir string
	// HealthURL is a CNI agent health endpoint to GET (2xx is healthy). When set it replaces
	// the preset's probes; use it for a CNI without a preset or a non-default port.
	HealthURL string
	// Preset selects the CNI agent's own health probe: PresetAuto (the default, chosen from
	// the default network's plugin types; an unknown CNI gets the file checks only),
	// PresetNone, PresetAWSVPCCNI, PresetCilium or PresetCalico.
	Preset string
	// Timeout bounds the health request; DefaultTimeout when zero.
	Timeout time.Duration
	// HTTPClient makes the health request; when nil, a client that never uses a proxy.
	HTTPClient *http.Client
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Collector is the CNI check. It holds no state between checks; Check is safe for concurrent
// use.
type Collector struct {
	hostRoot  string
	confDir   string // cleaned, relative to hostRoot, slash-separated
	binDir    string
	healthURL string
	preset    string
	timeout   time.Duration
	client    *http.Client
	now       func() time.Time
	// dial opens the connection of a gRPC health probe (dialNet).
	dial func(ctx context.Context, network, address string) (net.Conn, error)
	// mu guards transports, the gRPC health transports by endpoint.
	mu         sync.Mutex
	transports map[string]*http.Transport
}

// New validates cfg, fills defaults and returns a Collector. It does not touch the host.
func New(cfg Config) (*Collector, error) {
	c := &Collector{
		hostRoot:  cfg.HostRoot,
		confDir:   cleanRel(cfg.ConfDir, DefaultConfDir),
		binDir:    cleanRel(cfg.BinDir, DefaultBinDir),
		healthURL: cfg.HealthURL,
		preset:    cfg.Preset,
		dial:      dialNet,
		timeout:   cfg.Timeout,
		client:    cfg.HTTPClient,
		now:       cfg.Now,
	}
	if c.hostRoot == "" {
		c.hostRoot = "/"
	}
	if c.timeout < 0 {
		return nil, fmt.Errorf("cni: Timeout %v must not be negative", cfg.Timeout)
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.healthURL != "" {
		u, err := url.Parse(c.healthURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("cni: HealthURL %q must be an absolute http or https URL such as http://127.0.0.1:9879/healthz", cfg.HealthURL)
		}
	}
	switch c.preset {
	case "", PresetAuto, PresetNone:
	default:
		if _, ok := findPreset(c.preset); !ok {
			return nil, fmt.Errorf("cni: Preset %q is not one of %s", cfg.Preset, strings.Join(PresetNames(), ", "))
		}
	}
	if c.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// The endpoint is node-local: a proxy from the pod's environment must not see it.
		tr.Proxy = nil
		tr.MaxIdleConns = 1
		c.client = &http.Client{Transport: tr}
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c, nil
}

// cleanRel turns a configured directory into a clean host path without the leading slash,
// accepting both "etc/cni/net.d" and "/etc/cni/net.d".
func cleanRel(dir, def string) string {
	if dir == "" {
		dir = def
	}
	return strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(dir)), "/")
}

// Name returns "cni".
func (c *Collector) Name() collectors.CheckName { return Name }

// Check finds the default network configuration, validates it and its plugin binaries, and
// asks the CNI agent's health endpoint if one is configured. It returns within Timeout plus
// the time of a few local file reads.
func (c *Collector) Check(ctx context.Context) collectors.Result {
	res := collectors.Result{Check: Name, Time: c.now()}
	set := func(s collectors.Status, reason, msg string, err error) collectors.Result {
		res.Status, res.Reason, res.Message, res.Err = s, reason, msg, err
		return res
	}
	if err := ctx.Err(); err != nil {
		return set(collectors.StatusUnknown, ReasonCheckCanceled, "cni check canceled before it ran", err)
	}

	file, err := c.defaultConfig()
	switch {
	case isMissing(err):
		return set(collectors.StatusUnhealthy, ReasonNoCNIConfig, fmt.Sprintf("no CNI network config in /%s (directory missing)", c.confDir), nil)
	case err != nil:
		return set(collectors.StatusUnknown, ReasonCNIUnreadable, fmt.Sprintf("read /%s: %v", c.confDir, err), err)
	case file == "":
		return set(collectors.StatusUnhealthy, ReasonNoCNIConfig,
			fmt.Sprintf("no CNI network config (*.conf, *.conflist, *.json) in /%s", c.confDir), nil)
	}
	hostFile := "/" + path.Join(c.confDir, file)

	data, err := c.readHostFile(path.Join(c.confDir, file))
	switch {
	case errors.Is(err, errTooLarge):
		return set(collectors.StatusUnhealthy, ReasonInvalidCNIConfig, fmt.Sprintf("%s: %v", hostFile, err), nil)
	case err != nil:
		return set(collectors.StatusUnknown, ReasonCNIUnreadable, fmt.Sprintf("read %s: %v", hostFile, err), err)
	}
	nc, err := parseConfig(file, data)
	if err != nil {
		return set(collectors.StatusUnhealthy, ReasonInvalidCNIConfig, fmt.Sprintf("%s: invalid CNI config: %v", hostFile, err), nil)
	}
	if nc.PluginsFromDir {
		if nc.Types, err = c.pluginsFromDir(nc.Name); err != nil {
			var rerr readError
			if errors.As(err, &rerr) {
				return set(collectors.StatusUnknown, ReasonCNIUnreadable, fmt.Sprintf("%s: %v", hostFile, err), err)
			}
			return set(collectors.StatusUnhealthy, ReasonInvalidCNIConfig, fmt.Sprintf("%s: invalid CNI config: %v", hostFile, err), nil)
		}
	}

	problems, err := c.checkPlugins(nc.Types)
	if err != nil {
		return set(collectors.StatusUnknown, ReasonCNIUnreadable, fmt.Sprintf("%s: check plugins in /%s: %v", hostFile, c.binDir, err), err)
	}
	if len(problems) > 0 {
		return set(collectors.StatusUnhealthy, ReasonCNIPluginMissing,
			fmt.Sprintf("%s (network %q): %s", hostFile, nc.Name, strings.Join(problems, "; ")), nil)
	}

	msg := fmt.Sprintf("%s: network %q (cniVersion %s), plugins %s present in /%s",
		hostFile, nc.Name, nc.CNIVersion, strings.Join(nc.Types, ", "), c.binDir)
	res.Inputs = append(res.Inputs, collectors.Input{Name: "default network", Source: hostFile,
		Value: fmt.Sprintf("%q, plugins %s", nc.Name, strings.Join(nc.Types, ", ")), Threshold: "valid, every plugin an executable in /" + c.binDir})
	probes, how := c.probesFor(nc.Types)
	if len(probes) == 0 {
		return set(collectors.StatusHealthy, ReasonCNIReady, msg, nil)
	}
	var (
		seen      []string
		unhealthy []string
		unknown   []string
	)
	for _, ap := range probes {
		r := c.runProbe(ctx, ap)
		if ctx.Err() != nil {
			return set(collectors.StatusUnknown, ReasonCheckCanceled, fmt.Sprintf("%s; CNI agent health check canceled: %v", msg, ctx.Err()), ctx.Err())
		}
		line := fmt.Sprintf("%s %s %s", r.agent, r.probe, r.detail)
		want := "2xx"
		if r.probe.kind == probeGRPCHealth {
			want = "SERVING"
		}
		res.Inputs = append(res.Inputs, collectors.Input{Name: r.agent + how, Source: r.probe.String(), Value: r.detail, Threshold: want})
		seen = append(seen, line)
		switch {
		case r.unknown:
			unknown = append(unknown, line)
		case !r.healthy:
			unhealthy = append(unhealthy, line)
		}
	}
	if len(unhealthy) > 0 {
		return set(collectors.StatusUnhealthy, ReasonCNIAgentUnhealthy,
			fmt.Sprintf("%s; but the CNI agent is not healthy%s: %s", msg, how, strings.Join(unhealthy, "; ")), nil)
	}
	if len(unknown) > 0 {
		return set(collectors.StatusUnknown, ReasonCNIAgentUnknown,
			fmt.Sprintf("%s; cannot observe the CNI agent%s: %s", msg, how, strings.Join(unknown, "; ")), nil)
	}
	return set(collectors.StatusHealthy, ReasonCNIReady, fmt.Sprintf("%s; %s", msg, strings.Join(seen, "; ")), nil)
}

// isMissing reports whether err means a path does not exist (a component may also be a file
// where a directory was expected).
func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// defaultConfig returns the name of the lexically first configuration file in the conf
// directory, or "" when there is none. Directories are skipped; os.ReadDir sorts by name,
// which is the byte-wise order libcni's sort.Strings gives.
func (c *Collector) defaultConfig() (string, error) {
	dir, err := resolveInRoot(c.hostRoot, c.confDir)
	if err != nil {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if !e.IsDir() && isConfigFile(e.Name()) {
			return e.Name(), nil
		}
	}
	return "", nil
}

var errTooLarge = fmt.Errorf("larger than %d bytes, the limit containerd applies", maxConfigSize)

// readHostFile reads a host file of at most maxConfigSize bytes.
func (c *Collector) readHostFile(name string) ([]byte, error) {
	p, err := resolveInRoot(c.hostRoot, name)
	if err != nil {
		return nil, err
	}
	data, err := hostfile.Read(p, nil, maxConfigSize)
	if errors.Is(err, hostfile.ErrTooLarge) {
		return nil, errTooLarge
	}
	return data, err
}

// readError marks a failure to read (as opposed to invalid content) in pluginsFromDir.
type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }
func (e readError) Unwrap() error { return e.err }

// pluginsFromDir loads the plugin types of a CNI 1.1 network whose plugins live in
// <conf dir>/<network>/*.conf, in lexical order.
func (c *Collector) pluginsFromDir(network string) ([]string, error) {
	rel := path.Join(c.confDir, network)
	dir, err := resolveInRoot(c.hostRoot, rel)
	if isMissing(err) {
		return nil, fmt.Errorf(`no "plugins" list and no plugin directory /%s`, rel)
	}
	if err != nil {
		return nil, readError{err}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, readError{err}
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && filepath.Ext(e.Name()) == ".conf" {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, fmt.Errorf(`no "plugins" list and no *.conf in /%s`, rel)
	}
	types := make([]string, 0, len(names))
	for _, n := range names {
		data, err := c.readHostFile(path.Join(rel, n))
		if errors.Is(err, errTooLarge) {
			return nil, fmt.Errorf("/%s/%s: %w", rel, n, err)
		}
		if err != nil {
			return nil, readError{err}
		}
		t, err := pluginType(data)
		if err != nil {
			return nil, fmt.Errorf("/%s/%s: %w", rel, n, err)
		}
		types = append(types, t)
	}
	return types, nil
}

// checkPlugins returns one problem per plugin type that is not an executable regular file in
// the binary directory. err is set only when the check could not look.
func (c *Collector) checkPlugins(types []string) (problems []string, err error) {
	for i, t := range types {
		if slices.Contains(types[:i], t) {
			continue
		}
		p, err := resolveInRoot(c.hostRoot, path.Join(c.binDir, t))
		if isMissing(err) {
			problems = append(problems, fmt.Sprintf("plugin %q missing from /%s", t, c.binDir))
			continue
		}
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		switch {
		case !fi.Mode().IsRegular():
			problems = append(problems, fmt.Sprintf("plugin %q in /%s is not a regular file (%v)", t, c.binDir, fi.Mode().Type()))
		case fi.Mode().Perm()&0o111 == 0:
			problems = append(problems, fmt.Sprintf("plugin %q in /%s is not executable (mode %v)", t, c.binDir, fi.Mode().Perm()))
		}
	}
	return problems, nil
}
