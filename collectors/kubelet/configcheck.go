package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/procfs"
	"sigs.k8s.io/yaml"

	"github.com/nodevigil/nodevigil/collectors"
)

// Reasons of the "kubelet-config" check.
const (
	// ReasonKubeletConfigValid: every registered startup taint is well formed and every
	// expected one is registered.
	ReasonKubeletConfigValid = "KubeletConfigValid"
	// ReasonStartupTaintMalformed: an entry of --register-with-taints or registerWithTaints
	// is rejected or dropped by the kubelet.
	ReasonStartupTaintMalformed = "StartupTaintMalformed"
	// ReasonStartupTaintMissing: an expected startup taint is not registered.
	ReasonStartupTaintMissing = "StartupTaintMissing"
	// ReasonKubeletProcessNotFound: no kubelet process under <HostRoot>/proc (Unknown).
	ReasonKubeletProcessNotFound = "KubeletProcessNotFound"
	// ReasonKubeletConfigUnreadable: the kubelet's --config file or --config-dir could not be
	// read or parsed (Unknown).
	ReasonKubeletConfigUnreadable = "KubeletConfigUnreadable"
)

const (
	configCheckName = "kubelet-config"
	// maxConfigBytes bounds what is read of a kubelet configuration file.
	maxConfigBytes = 1 << 20
)

// ConfigCheckConfig configures the "kubelet-config" check.
type ConfigCheckConfig struct {
	// HostRoot is where the host's root filesystem is mounted ("/" by default); the kubelet
	// is looked for in <HostRoot>/proc and its config files are read under HostRoot.
	HostRoot string
	// ExpectedTaints are the startup taints the agent owns and expects the kubelet to
	// register: "key", "key:Effect" or "key=value:Effect". A taint matches by key, and by
	// effect when one is given.
	ExpectedTaints []string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// ConfigCheck finds the running kubelet and validates the startup taints it registers the
// Node with. It exists because a mis-quoted --register-with-taints silently registers the
// node without its startup taint, and the node is killed 15 minutes later with an opaque
// "missing required startup taint"; from the node, the exact mistake is visible in seconds.
type ConfigCheck struct {
	hostRoot string
	expected []Taint
	now      func() time.Time
}

// NewConfigCheck validates cfg (every expected taint must parse) and fills defaults.
func NewConfigCheck(cfg ConfigCheckConfig) (*ConfigCheck, error) {
	if cfg.HostRoot == "" {
		cfg.HostRoot = "/"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	expected := make([]Taint, 0, len(cfg.ExpectedTaints))
	for i, spec := range cfg.ExpectedTaints {
		t, err := ParseExpectedTaint(spec)
		if err != nil {
			return nil, fmt.Errorf("kubelet: ConfigCheckConfig.ExpectedTaints[%d]: %w", i, err)
		}
		expected = append(expected, t)
	}
	return &ConfigCheck{hostRoot: cfg.HostRoot, expected: expected, now: cfg.Now}, nil
}

// Name returns "kubelet-config".
func (c *ConfigCheck) Name() string { return configCheckName }

// kubeletProcess is what the check learns from /proc.
type kubeletProcess struct {
	pid  int
	args []string
}

// taintSource is where the effective startup taints come from, in kubelet precedence:
// the flag overrides drop-ins, which override the --config file.
type taintSource struct {
	// kind is "flag", "file" or "none".
	kind string
	// where names the flag or file for messages.
	where string
	// raw is the flag value (kind "flag").
	raw string
	// taints are the structured entries (kind "file").
	taints []Taint
	// configPath is the --config file under HostRoot, if any (for suggestions).
	configPath string
}

// Check reads /proc and the kubelet's configuration. Reading is bounded by the file system,
// not the network; ctx is checked between processes so a huge /proc cannot hold it long.
func (c *ConfigCheck) Check(ctx context.Context) collectors.Result {
	res := collectors.Result{Check: configCheckName, Time: c.now()}
	proc, err := findKubelet(ctx, filepath.Join(c.hostRoot, "proc"))
	if err != nil {
		res.Status, res.Reason = collectors.StatusUnknown, ReasonKubeletProcessNotFound
		res.Message = fmt.Sprintf("cannot validate the kubelet's startup taints: %v", err)
		res.Err = err
		return res
	}
	flags := parseKubeletArgs(proc.args)
	src, err := c.effectiveTaints(flags)
	if err != nil {
		res.Status, res.Reason = collectors.StatusUnknown, ReasonKubeletConfigUnreadable
		res.Message = fmt.Sprintf("cannot validate the startup taints of kubelet pid %d: %v", proc.pid, err)
		res.Err = err
		return res
	}
	return c.judge(res, proc.pid, src)
}

// judge validates the effective taints and compares them with the expectations.
func (c *ConfigCheck) judge(res collectors.Result, pid int, src taintSource) collectors.Result {
	var (
		taints   []Taint
		problems []Problem
		repaired []Taint // what the malformed entries would register once fixed
	)
	switch src.kind {
	case "flag":
		taints, problems = ParseRegisterWithTaints(src.raw)
		for _, p := range problems {
			if t, ok := repairEntry(p.Entry); ok {
				repaired = append(repaired, t)
			}
		}
	case "file":
		for _, t := range src.taints {
			if msg := validateTaint(t); msg != "" {
				problems = append(problems, Problem{
					Entry:   t.String(),
					Reason:  ReasonStartupTaintMalformed,
					Message: fmt.Sprintf("registerWithTaints entry {key: %q, value: %q, effect: %q} in %s %s; %s", t.Key, t.Value, t.Effect, src.where, msg, fileFix(t)),
				})
				continue
			}
			taints = append(taints, t)
		}
	}
	malformed := len(problems)

	var missing []Taint
	for _, want := range c.expected {
		if matchTaint(taints, want) || matchTaint(repaired, want) {
			continue // present, or present once the malformed entry is fixed (reported above)
		}
		missing = append(missing, want)
	}
	registered := append(append([]Taint(nil), taints...), repaired...)
	for _, want := range missing {
		problems = append(problems, Problem{
			Entry:   want.String(),
			Reason:  ReasonStartupTaintMissing,
			Message: missingMessage(want, registered, missing, src),
		})
	}

	switch {
	case malformed > 0:
		res.Status, res.Reason = collectors.StatusUnhealthy, ReasonStartupTaintMalformed
	case len(problems) > 0:
		res.Status, res.Reason = collectors.StatusUnhealthy, ReasonStartupTaintMissing
	default:
		res.Status, res.Reason = collectors.StatusHealthy, ReasonKubeletConfigValid
		from := "from " + src.where
		if src.kind == "none" {
			from = "(" + src.where + ")"
		}
		res.Message = fmt.Sprintf("kubelet pid %d registers %d startup taint(s) %s %s; all %d expected present",
			pid, len(taints), taintList(taints), from, len(c.expected))
		return res
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.Message
	}
	res.Message = fmt.Sprintf("kubelet pid %d: %s", pid, strings.Join(msgs, "; "))
	return res
}

// matchTaint reports whether want is among taints: same key, and same effect when want has one.
func matchTaint(taints []Taint, want Taint) bool {
	for _, t := range taints {
		if t.Key == want.Key && (want.Effect == "" || t.Effect == want.Effect) {
			return true
		}
	}
	return false
}

// missingMessage words the fix for a missing expected taint for the source in use.
func missingMessage(want Taint, have, missing []Taint, src taintSource) string {
	add := want
	if add.Effect == "" {
		add.Effect = effectNoSchedule
	}
	var wrongEffect string
	for _, t := range have {
		if t.Key == want.Key {
			wrongEffect = fmt.Sprintf(" (registered with effect %s instead of %s)", t.Effect, want.Effect)
		}
	}
	head := fmt.Sprintf("expected startup taint %q is not registered by the kubelet%s", want.String(), wrongEffect)
	switch src.kind {
	case "file":
		return fmt.Sprintf("%s; add %s to registerWithTaints in %s", head, yamlTaint(add), src.where)
	default:
		// Keep what is registered (minus the wrongly-effected entries) and add all missing.
		var parts []string
		for _, t := range have {
			if !matchTaint(missing, Taint{Key: t.Key}) {
				parts = append(parts, t.String())
			}
		}
		for _, m := range missing {
			if m.Effect == "" {
				m.Effect = effectNoSchedule
			}
			parts = append(parts, m.String())
		}
		fix := fmt.Sprintf("%s; pass --register-with-taints=%s to the kubelet", head, strings.Join(parts, ","))
		if src.kind == "none" && src.configPath != "" {
			fix += fmt.Sprintf(" or add %s to registerWithTaints in %s", yamlTaint(add), src.configPath)
		}
		return fix
	}
}

// yamlTaint renders a taint as a flow-style YAML entry of registerWithTaints.
func yamlTaint(t Taint) string {
	if t.Value == "" {
		return fmt.Sprintf("{key: %s, effect: %s}", t.Key, t.Effect)
	}
	return fmt.Sprintf("{key: %s, value: %q, effect: %s}", t.Key, t.Value, t.Effect)
}

// fileFix words the fix for a malformed structured taint.
func fileFix(t Taint) string {
	clean := func(s string) string { return strings.Trim(strings.TrimSpace(s), "\"'`") }
	fixed := Taint{Key: clean(t.Key), Value: clean(t.Value), Effect: clean(t.Effect)}
	if e := effectFold(fixed.Effect); e != "" {
		fixed.Effect = e
	}
	if validateTaint(fixed) == "" {
		return "write it as " + yamlTaint(fixed)
	}
	return "the key must be a qualified name, the value a label value and the effect one of " + strings.Join(validEffects, ", ")
}

func taintList(ts []Taint) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return "[" + strings.Join(s, ",") + "]"
}

// errKubeletNotFound is returned when /proc holds no kubelet.
var errKubeletNotFound = errors.New("no kubelet process found")

// findKubelet scans procDir for the process whose comm, or argv[0] basename, is "kubelet",
// lowest PID first. Processes that exit during the scan are skipped.
func findKubelet(ctx context.Context, procDir string) (kubeletProcess, error) {
	fs, err := procfs.NewFS(procDir)
	if err != nil {
		return kubeletProcess{}, fmt.Errorf("open %s: %w", procDir, err)
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return kubeletProcess{}, fmt.Errorf("list processes in %s: %w", procDir, err)
	}
	sort.Sort(procs)
	for _, p := range procs {
		if err := ctx.Err(); err != nil {
			return kubeletProcess{}, fmt.Errorf("scan %s: %w", procDir, err)
		}
		comm, err := p.Comm()
		if err != nil {
			continue
		}
		args, err := p.CmdLine()
		if err != nil || len(args) == 0 {
			continue // exited, or a kernel thread
		}
		if comm == "kubelet" || path.Base(args[0]) == "kubelet" {
			return kubeletProcess{pid: p.PID, args: args}, nil
		}
	}
	return kubeletProcess{}, fmt.Errorf("%w in %s (is the agent running with the host's /proc?)", errKubeletNotFound, procDir)
}

// kubeletFlags holds the few kubelet flags this check needs.
type kubeletFlags struct {
	config    string
	configDir string
	taints    string
	taintsSet bool
}

// parseKubeletArgs extracts --config, --config-dir and --register-with-taints from argv the
// way pflag reads them (--name=value or --name value; the last occurrence wins). Quote
// characters in front of a flag name, the remains of shell quoting gone wrong, are moved
// onto the value so the taint parser reports them.
func parseKubeletArgs(args []string) kubeletFlags {
	var f kubeletFlags
	for i := 1; i < len(args); i++ {
		arg := args[i]
		trimmed := strings.TrimLeft(arg, "\"'`")
		lead := arg[:len(arg)-len(trimmed)]
		if !strings.HasPrefix(trimmed, "--") {
			continue
		}
		name, value, hasValue := strings.Cut(trimmed[2:], "=")
		if !hasValue {
			switch name {
			case "config", "config-dir", "register-with-taints":
				if i+1 < len(args) {
					i++
					value = args[i]
				}
			default:
				continue
			}
		}
		switch name {
		case "config":
			f.config = value
		case "config-dir":
			f.configDir = value
		case "register-with-taints":
			f.taints = lead + value
			f.taintsSet = true
		}
	}
	return f
}

// kubeletConfigFile is the part of KubeletConfiguration (YAML or JSON) this check reads. A
// pointer tells "absent" (nil) from "set to empty" ([]): only the former falls through to
// the next source.
type kubeletConfigFile struct {
	RegisterWithTaints *[]configTaint `json:"registerWithTaints"`
}

type configTaint struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Effect string `json:"effect"`
}

// effectiveTaints applies kubelet precedence: --register-with-taints, then the last
// drop-in in --config-dir (*.conf, lexical order) that sets registerWithTaints, then the
// --config file.
func (c *ConfigCheck) effectiveTaints(f kubeletFlags) (taintSource, error) {
	if f.taintsSet {
		return taintSource{kind: "flag", where: "--register-with-taints", raw: f.taints}, nil
	}
	if f.configDir != "" {
		dir := c.hostPath(f.configDir)
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return taintSource{}, fmt.Errorf("read --config-dir %s: %w", dir, err)
		}
		for i := len(entries) - 1; i >= 0; i-- { // ReadDir sorts by name; the last wins
			e := entries[i]
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".conf") {
				continue
			}
			p := filepath.Join(dir, e.Name())
			taints, set, err := readConfigTaints(p)
			if err != nil {
				return taintSource{}, err
			}
			if set {
				return taintSource{kind: "file", where: p, taints: taints}, nil
			}
		}
	}
	if f.config != "" {
		p := c.hostPath(f.config)
		taints, set, err := readConfigTaints(p)
		if err != nil {
			return taintSource{}, err
		}
		if set {
			return taintSource{kind: "file", where: p, taints: taints}, nil
		}
	}
	src := taintSource{kind: "none", where: "no --register-with-taints flag nor registerWithTaints setting"}
	if f.config != "" {
		src.configPath = c.hostPath(f.config)
	}
	return src, nil
}

// hostPath resolves a path as seen by the kubelet under HostRoot. Relative paths are taken
// from the host's root, the kubelet's working directory under systemd.
func (c *ConfigCheck) hostPath(p string) string {
	return filepath.Join(c.hostRoot, filepath.Join("/", p))
}

// readConfigTaints reads registerWithTaints from a KubeletConfiguration file (YAML or JSON).
func readConfigTaints(p string) ([]Taint, bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, false, fmt.Errorf("read kubelet config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, false, fmt.Errorf("read kubelet config %s: %w", p, err)
	}
	if len(data) > maxConfigBytes {
		return nil, false, fmt.Errorf("kubelet config %s is larger than %d bytes", p, maxConfigBytes)
	}
	taints, set, err := parseConfigTaints(data)
	if err != nil {
		return nil, false, fmt.Errorf("parse kubelet config %s: %w", p, err)
	}
	return taints, set, nil
}

// parseConfigTaints extracts registerWithTaints from KubeletConfiguration bytes.
func parseConfigTaints(data []byte) ([]Taint, bool, error) {
	var cfg kubeletConfigFile
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, false, err
	}
	if cfg.RegisterWithTaints == nil {
		return nil, false, nil
	}
	taints := make([]Taint, 0, len(*cfg.RegisterWithTaints))
	for _, t := range *cfg.RegisterWithTaints {
		taints = append(taints, Taint(t))
	}
	return taints, true, nil
}
