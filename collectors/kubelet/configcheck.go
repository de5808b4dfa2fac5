package kubelet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/procfs"
	"sigs.k8s.io/yaml"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/hostfile"
)

// Reasons of the "kubelet-config" check.
const (
	// ReasonKubeletConfigValid: every registered startup taint is well formed and every
	// expected one is registered.
	ReasonKubeletConfigValid = "KubeletConfigValid"
	// ReasonStartupTaintMalformed: an entry of --register-with-taints or registerWithTaints
	// is rejected or dropped by the kubelet (or by the API server when the node registers).
	ReasonStartupTaintMalformed = "StartupTaintMalformed"
	// ReasonStartupTaintMissing: an expected startup taint is not registered. It is a
	// configuration advisory (Warning: the node works, it is only schedulable earlier than
	// the agent would like) unless ConfigCheckConfig.MissingIsUnhealthy is set.
	ReasonStartupTaintMissing = "StartupTaintMissing"
	// ReasonKubeletProcessNotFound: no kubelet process under <HostRoot>/proc and no kubelet
	// unit file to rebuild its command line from (Unknown).
	ReasonKubeletProcessNotFound = "KubeletProcessNotFound"
	// ReasonKubeletConfigUnreadable: the kubelet's --config file, --config-dir, unit files or
	// environment files could not be read or parsed (Unknown).
	ReasonKubeletConfigUnreadable = "KubeletConfigUnreadable"
)

const (
	configCheckName = collectors.CheckKubeletConfig
	// maxConfigBytes bounds what is read of a kubelet configuration file.
	maxConfigBytes = 1 << 20
	// DefaultKubeletUnit is the systemd unit the kubelet runs as on EKS AMIs.
	DefaultKubeletUnit = "kubelet.service"
	// nodeadmEnvironmentFile is where AL2023's nodeadm writes the kubelet's flags
	// (NODEADM_KUBELET_ARGS), from NodeConfig spec.kubelet.flags.
	nodeadmEnvironmentFile = "/etc/eks/kubelet/environment"
)

// ConfigCheckConfig configures the "kubelet-config" check.
type ConfigCheckConfig struct {
	// HostRoot is where the host's root filesystem is mounted ("/" by default); the kubelet
	// is looked for in <HostRoot>/proc and its unit and config files are read under HostRoot.
	HostRoot string
	// Unit is the kubelet's systemd unit (DefaultKubeletUnit when empty). When no kubelet
	// process exists, its command line is rebuilt from this unit's files.
	Unit string
	// ExpectedTaints are the startup taints the agent owns and expects the kubelet to
	// register: "key", "key:Effect" or "key=value:Effect". A taint matches by key, and by
	// effect when one is given.
	ExpectedTaints []string
	// MissingIsUnhealthy makes a missing expected taint Unhealthy instead of an advisory
	// (Warning). Set it when something outside the node requires the taint (a
	// Karpenter NodePool listing it in startupTaints kills nodes that lack it).
	MissingIsUnhealthy bool
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// ConfigCheck validates the startup taints the kubelet registers its Node with, from the
// running kubelet's command line or, when it is not running, from everything systemd would
// start it with. It exists because a mis-quoted --register-with-taints either makes the
// kubelet exit at once (the node never joins) or silently registers the node without its
// startup taint, and the node is killed 15 minutes later with an opaque "missing required
// startup taint"; from the node, the exact mistake is visible in seconds.
type ConfigCheck struct {
	hostRoot           string
	unit               string
	expected           []Taint
	missingIsUnhealthy bool
	now                func() time.Time
	// kubeletPID is the PID the kubelet was last found at (0: not found yet). The next
	// check looks there first and scans /proc only when that process is no longer the
	// kubelet: a node has hundreds of processes, and a scan reads two files of each.
	kubeletPID atomic.Int64
}

// NewConfigCheck validates cfg (every expected taint must parse) and fills defaults.
func NewConfigCheck(cfg ConfigCheckConfig) (*ConfigCheck, error) {
	if cfg.HostRoot == "" {
		cfg.HostRoot = "/"
	}
	if cfg.Unit == "" {
		cfg.Unit = DefaultKubeletUnit
	}
	if strings.ContainsAny(cfg.Unit, "/\x00") {
		return nil, fmt.Errorf("kubelet: ConfigCheckConfig.Unit %q must be a unit name such as %s", cfg.Unit, DefaultKubeletUnit)
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
	return &ConfigCheck{hostRoot: cfg.HostRoot, unit: cfg.Unit, expected: expected, missingIsUnhealthy: cfg.MissingIsUnhealthy, now: cfg.Now}, nil
}

// Name returns "kubelet-config".
func (c *ConfigCheck) Name() collectors.CheckName { return configCheckName }

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
	// from is where the flag was written in the unit files, when known (kind "flag").
	from *unitArg
	// argWord is the whole argument that carried the flag, for the corrected line.
	argWord string
}

// Check reads /proc, the kubelet's unit files and its configuration. Reading is bounded by
// the file system, not the network; ctx is checked between processes so a huge /proc
// cannot hold it long.
func (c *ConfigCheck) Check(ctx context.Context) collectors.Result {
	res := collectors.Result{Check: configCheckName, Time: c.now()}
	procDir := filepath.Join(c.hostRoot, "proc")
	proc, perr := findKubelet(ctx, procDir, int(c.kubeletPID.Load()))
	c.kubeletPID.Store(int64(proc.pid)) // 0 when not found
	// The unit is read even when the process exists: it names the file to fix.
	unit, uerr := loadKubeletUnit(c.hostRoot, c.unit)

	var (
		args []string
		who  string
	)
	switch {
	case perr == nil:
		args, who = proc.args, fmt.Sprintf("kubelet pid %d", proc.pid)
		res.Inputs = append(res.Inputs, collectors.Input{Name: "kubelet command line", Source: fmt.Sprintf("/proc/%d/cmdline", proc.pid), Value: fmt.Sprintf("%d arguments", len(args))})
	case errors.Is(perr, errKubeletNotFound) && uerr == nil:
		args = unit.args()
		dialect := "systemd >= 233 rules"
		if unit.legacy {
			dialect = "systemd < 233 rules (Amazon Linux 2)"
		}
		res.Inputs = append(res.Inputs, collectors.Input{Name: "kubelet command line", Source: strings.Join(unit.files, ", "),
			Value: fmt.Sprintf("%d arguments rebuilt from ExecStart= at %s:%d with %s", len(args), unit.exec.file, unit.exec.line, dialect)})
		who = fmt.Sprintf("%s (no kubelet process; command line rebuilt from %s)", c.unit, strings.Join(unit.files, ", "))
	case errors.Is(perr, errKubeletNotFound) && !errors.Is(uerr, errUnitNotFound):
		res.Status, res.Reason = collectors.StatusUnknown, ReasonKubeletConfigUnreadable
		res.Message = fmt.Sprintf("cannot validate the kubelet's startup taints: %v, and its unit cannot be read: %v", perr, uerr)
		res.Err = fmt.Errorf("%w; %w", perr, uerr)
		return res
	default:
		res.Status, res.Reason = collectors.StatusUnknown, ReasonKubeletProcessNotFound
		res.Message = fmt.Sprintf("cannot validate the kubelet's startup taints: %v", perr)
		if uerr != nil && errors.Is(perr, errKubeletNotFound) {
			res.Message += fmt.Sprintf("; nor from its unit: %v (is the host's root mounted at the host root?)", uerr)
		}
		res.Err = perr
		return res
	}
	flags := parseKubeletArgs(args)
	src, err := c.effectiveTaints(flags)
	if err != nil {
		res.Status, res.Reason = collectors.StatusUnknown, ReasonKubeletConfigUnreadable
		res.Message = fmt.Sprintf("cannot validate the startup taints of %s: %v", who, err)
		res.Err = err
		return res
	}
	if src.kind == "flag" {
		src.argWord = args[flags.taintsArg]
		src.from = c.flagOrigin(flags, unit, perr == nil)
	}
	switch src.kind {
	case "flag":
		in := collectors.Input{Name: "--register-with-taints", Source: "command line", Value: src.raw,
			Threshold: "key[=value]:Effect,... as the kubelet parses it (pkg/util/taints.ParseTaints)"}
		if src.from != nil {
			in.Source = fmt.Sprintf("%s:%d %s", src.from.from.file, src.from.from.line, src.from.from.directive)
			if src.from.from.variable != "" {
				in.Source += " " + src.from.from.variable
			}
		}
		res.Inputs = append(res.Inputs, in)
	case "file":
		res.Inputs = append(res.Inputs, collectors.Input{Name: "registerWithTaints", Source: src.where, Value: taintList(src.taints),
			Threshold: "kubelet config validation, then API server Node validation"})
	default:
		res.Inputs = append(res.Inputs, collectors.Input{Name: "registered startup taints", Value: src.where})
	}
	if len(c.expected) > 0 {
		res.Inputs = append(res.Inputs, collectors.Input{Name: "expected startup taints", Source: "agent configuration (owned taints)",
			Value: taintList(c.expected), Threshold: "each registered (same key, and same effect when one is given)"})
	}
	return c.judge(res, who, src, unit)
}

// flagOrigin finds the unit-file word that carries the taints flag: directly when the
// command line was rebuilt from the unit, or, for a running kubelet, when the unit files
// still produce the same value (otherwise they were edited after the kubelet started).
func (c *ConfigCheck) flagOrigin(flags kubeletFlags, unit *kubeletUnit, running bool) *unitArg {
	if unit == nil {
		return nil
	}
	if !running {
		a := unit.argv[flags.taintsArg]
		return &a
	}
	uf := parseKubeletArgs(unit.args())
	if !uf.taintsSet || uf.taints != flags.taints {
		return nil
	}
	a := unit.argv[uf.taintsArg]
	return &a
}

// judge validates the effective taints and compares them with the expectations.
func (c *ConfigCheck) judge(res collectors.Result, who string, src taintSource, unit *kubeletUnit) collectors.Result {
	var (
		taints   []Taint
		problems []Problem
		repaired []Taint // what the malformed entries would register once fixed
	)
	switch src.kind {
	case "flag":
		var flagProblems []Problem
		taints, flagProblems = ParseRegisterWithTaints(src.raw)
		fixLine := ""
		if len(flagProblems) > 0 {
			fixLine = correctedLine(src, unit, repairedFlag(strings.Split(src.raw, ",")))
		}
		for _, p := range flagProblems {
			if t, ok := repairEntry(p.Entry); ok {
				repaired = append(repaired, t)
			} else if k := entryKey(p.Entry); k != "" {
				// Not mechanically repairable, but it names the key: the message above
				// already covers an expectation on it.
				repaired = append(repaired, Taint{Key: k})
			}
			if src.from != nil {
				p.Message = fmt.Sprintf("%s:%d: %s", src.from.from.file, src.from.from.line, p.Message)
			}
			p.Message += fixLine
			problems = append(problems, p)
		}
	case "file":
		bad := map[int]bool{}
		for _, p := range ValidateConfigTaints(src.taints) {
			i, _ := strconv.Atoi(p.Entry)
			bad[i] = true
			t := src.taints[i]
			p.Entry = t.String()
			p.Message = fmt.Sprintf("registerWithTaints entry {key: %q, value: %q, effect: %q} in %s %s; %s; %s",
				t.Key, t.Value, t.Effect, src.where, p.Message, p.Effect, fileFix(t))
			problems = append(problems, p)
			if fixed, ok := repairConfigTaint(t); ok {
				repaired = append(repaired, fixed)
			}
		}
		for i, t := range src.taints {
			if !bad[i] {
				taints = append(taints, t)
			}
		}
	}
	malformed := len(problems)

	var missing []Taint
	for _, want := range c.expected {
		if matchTaint(taints, want) || matchTaint(repaired, want) || matchTaint(repaired, Taint{Key: want.Key}) && malformed > 0 {
			continue // present, or present once the malformed entry is fixed (reported above)
		}
		missing = append(missing, want)
	}
	registered := append(append([]Taint(nil), taints...), repaired...)
	for _, want := range missing {
		problems = append(problems, Problem{
			Entry:   want.String(),
			Reason:  ReasonStartupTaintMissing,
			Message: missingMessage(want, registered, missing, src, unit),
		})
	}

	switch {
	case malformed > 0:
		res.Status, res.Reason = collectors.StatusUnhealthy, ReasonStartupTaintMalformed
	case len(problems) > 0 && c.missingIsUnhealthy:
		res.Status, res.Reason = collectors.StatusUnhealthy, ReasonStartupTaintMissing
	case len(problems) > 0:
		res.Status, res.Reason = collectors.StatusWarning, ReasonStartupTaintMissing
	default:
		res.Status, res.Reason = collectors.StatusHealthy, ReasonKubeletConfigValid
		from := "from " + src.where
		if src.kind == "none" {
			from = "(" + src.where + ")"
		}
		res.Message = fmt.Sprintf("%s registers %d startup taint(s) %s %s; all %d expected present",
			who, len(taints), taintList(taints), from, len(c.expected))
		return res
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.Message
	}
	res.Message = fmt.Sprintf("%s: %s", who, strings.Join(msgs, "; "))
	if res.Reason == ReasonStartupTaintMissing && !c.missingIsUnhealthy {
		res.Message += " (advisory: the node works, but it can be scheduled before the agent removes its startup taint)"
	}
	return res
}

// entryKey is the key a malformed flag entry names once quotes and whitespace are dropped.
func entryKey(entry string) string {
	s := strings.TrimSpace(strings.Map(func(r rune) rune {
		if r == '"' || r == '\'' || r == '`' {
			return -1
		}
		return r
	}, entry))
	kv, _, _ := strings.Cut(s, ":")
	k, _, _ := strings.Cut(kv, "=")
	if qualifiedNameError(k) != "" {
		return ""
	}
	return k
}

// correctedLine words the line to write in place of the one that carries a malformed taints
// flag, given the repaired flag (empty when the entries need a human decision).
func correctedLine(src taintSource, unit *kubeletUnit, fix string) string {
	if fix == "" || src.from == nil {
		return ""
	}
	o := src.from.from
	switch o.directive {
	case "Environment", "EnvironmentFile":
		value := replaceFlagInValue(o.value, fix)
		var line string
		if o.directive == "Environment" {
			line = fmt.Sprintf("Environment=%s", systemdQuote(o.variable+"="+value))
		} else {
			line = fmt.Sprintf("%s=%s", o.variable, envFileQuote(value))
		}
		out := fmt.Sprintf("; write: %s", line)
		if src.from.braced && unit != nil {
			out += fmt.Sprintf(" (ExecStart= in %s:%d uses ${%s}, which passes the value verbatim as one argument, quotes included; $%s would split it into words and remove the quotes)",
				unit.exec.file, unit.exec.line, o.variable, o.variable)
		}
		if o.file == nodeadmEnvironmentFile {
			out += fmt.Sprintf(" (nodeadm rewrites this file at boot from NodeConfig spec.kubelet.flags: write the flag there as - %s)", fix)
		}
		return out
	case "ExecStart":
		return fmt.Sprintf("; write the argument in ExecStart= as: %s", fix)
	}
	return ""
}

// replaceFlagInValue replaces the --register-with-taints flag (and its separate value word,
// if any) among the words of value with fix, the words split as systemd splits $VAR.
func replaceFlagInValue(value, fix string) string {
	words, _ := extractWords(value, false, true)
	out := make([]string, 0, len(words))
	replaced := false
	for i := 0; i < len(words); i++ {
		w := strings.TrimLeft(words[i], "\"'`")
		if strings.HasPrefix(w, "--register-with-taints") {
			if w == "--register-with-taints" && i+1 < len(words) {
				i++
			}
			if !replaced {
				out = append(out, fix)
				replaced = true
			}
			continue
		}
		out = append(out, words[i])
	}
	if !replaced {
		return fix
	}
	return strings.Join(out, " ")
}

// systemdQuote single-quotes a word for a unit file assignment, escaping what systemd's
// unquoting would otherwise interpret.
func systemdQuote(s string) string {
	r := strings.NewReplacer("\\", "\\\\", "'", "\\'")
	return "'" + r.Replace(s) + "'"
}

// envFileQuote writes a value for an environment file: bare when systemd reads it back
// unchanged, double-quoted with escapes otherwise.
func envFileQuote(s string) string {
	if !strings.ContainsAny(s, "\"'\\$`#;") {
		return s
	}
	r := strings.NewReplacer("\\", "\\\\", "\"", "\\\"", "`", "\\`", "$", "\\$")
	return "\"" + r.Replace(s) + "\""
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
func missingMessage(want Taint, have, missing []Taint, src taintSource, unit *kubeletUnit) string {
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
		flag := "--register-with-taints=" + strings.Join(parts, ",")
		fix := fmt.Sprintf("%s; pass %s to the kubelet%s", head, flag, whereToPass(src, unit, flag))
		if src.kind == "none" && src.configPath != "" {
			fix += fmt.Sprintf(" or add %s to registerWithTaints in %s", yamlTaint(add), src.configPath)
		}
		return fix
	}
}

// whereToPass names the place on this node where a kubelet flag belongs: the file that
// already carries --register-with-taints, else the variable the EKS AMIs reserve for extra
// flags (AL2: KUBELET_EXTRA_ARGS in a drop-in; AL2023: NodeConfig spec.kubelet.flags, which
// nodeadm writes to /etc/eks/kubelet/environment).
func whereToPass(src taintSource, unit *kubeletUnit, flag string) string {
	if src.from != nil && src.from.from.directive != "ExecStart" {
		return fmt.Sprintf(" (in %s of %s:%d)", src.from.from.variable, src.from.from.file, src.from.from.line)
	}
	if unit == nil {
		return ""
	}
	if v, ok := unit.env["NODEADM_KUBELET_ARGS"]; ok {
		return fmt.Sprintf(" (NodeConfig spec.kubelet.flags: - %s; nodeadm writes it to NODEADM_KUBELET_ARGS in %s)", flag, v.from.file)
	}
	if v, ok := unit.env["KUBELET_EXTRA_ARGS"]; ok {
		return fmt.Sprintf(" (add it to KUBELET_EXTRA_ARGS in %s:%d)", v.from.file, v.from.line)
	}
	return ""
}

// yamlTaint renders a taint as a flow-style YAML entry of registerWithTaints.
func yamlTaint(t Taint) string {
	if t.Value == "" {
		return fmt.Sprintf("{key: %s, effect: %s}", t.Key, t.Effect)
	}
	return fmt.Sprintf("{key: %s, value: %q, effect: %s}", t.Key, t.Value, t.Effect)
}

// repairConfigTaint applies the mechanical fixes to a structured taint (quotes and
// surrounding whitespace dropped, the effect's case fixed) and reports whether the result
// is valid.
func repairConfigTaint(t Taint) (Taint, bool) {
	clean := func(s string) string { return strings.Trim(strings.TrimSpace(s), "\"'`") }
	fixed := Taint{Key: clean(t.Key), Value: clean(t.Value), Effect: clean(t.Effect)}
	if e := effectFold(fixed.Effect); e != "" {
		fixed.Effect = e
	}
	_, effect := configTaintIssue(fixed)
	return fixed, effect == EffectNone
}

// fileFix words the fix for a malformed structured taint.
func fileFix(t Taint) string {
	if fixed, ok := repairConfigTaint(t); ok {
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

// findKubelet returns the kubelet process under procDir: the process at hint (the PID it
// was last found at) when that is still a kubelet, or else the first kubelet in PID order.
// With a hint, a node whose kubelet keeps running costs two small reads per check instead
// of a scan of every process; a restarted kubelet has a new PID, so its old one is gone or
// belongs to another program, and the scan finds the new one.
func findKubelet(ctx context.Context, procDir string, hint int) (kubeletProcess, error) {
	if hint > 0 {
		// Read the two files directly: this is the path every check of a running node takes,
		// and procfs would first stat and statfs procDir and stat the process's directory.
		if args, ok := kubeletArgs(procDir, hint); ok {
			return kubeletProcess{pid: hint, args: args}, nil
		}
	}
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
		if args, ok := kubeletArgs(procDir, p.PID); ok {
			return kubeletProcess{pid: p.PID, args: args}, nil
		}
	}
	return kubeletProcess{}, fmt.Errorf("%w in %s (is the agent running with the host's /proc?)", errKubeletNotFound, procDir)
}

// maxCmdlineSize bounds how much of /proc/<pid>/cmdline is read, as procfs bounds it.
const maxCmdlineSize = 1 << 20

// kubeletArgs returns the command line of process pid under procDir when it is a kubelet: its
// comm or the base name of its argv[0] is "kubelet". A process that exited, or a kernel thread
// (no command line), is not. The files are parsed as procfs's Proc.Comm and Proc.CmdLine parse
// them (TestKubeletArgsAgreesWithProcfs).
func kubeletArgs(procDir string, pid int) ([]string, bool) {
	dir := filepath.Join(procDir, strconv.Itoa(pid))
	comm, err := hostfile.Read(filepath.Join(dir, "comm"), nil, 4096)
	if err != nil {
		return nil, false
	}
	cmdline, err := hostfile.Read(filepath.Join(dir, "cmdline"), nil, maxCmdlineSize)
	if err != nil {
		return nil, false
	}
	if len(cmdline) == 0 {
		return nil, false
	}
	args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	return args, strings.TrimSpace(string(comm)) == "kubelet" || path.Base(args[0]) == "kubelet"
}

// kubeletFlags holds the few kubelet flags this check needs.
type kubeletFlags struct {
	config    string
	configDir string
	taints    string
	taintsSet bool
	// taintsArg is the index in argv of the argument that carries the taints value (the
	// "--register-with-taints=..." word, or the word after "--register-with-taints").
	taintsArg int
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
		at := i
		if !hasValue {
			switch name {
			case "config", "config-dir", "register-with-taints":
				if i+1 < len(args) {
					i++
					at = i
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
			f.taintsArg = at
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
				return taintSource{kind: "file", where: path.Join("/", f.configDir, e.Name()), taints: taints}, nil
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
			return taintSource{kind: "file", where: path.Join("/", f.config), taints: taints}, nil
		}
	}
	src := taintSource{kind: "none", where: "no --register-with-taints flag nor registerWithTaints setting"}
	if f.config != "" {
		src.configPath = path.Join("/", f.config)
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
	data, err := hostfile.Read(p, nil, maxConfigBytes)
	if errors.Is(err, hostfile.ErrTooLarge) {
		return nil, false, fmt.Errorf("kubelet config %s is larger than %d bytes", p, maxConfigBytes)
	}
	if err != nil {
		return nil, false, fmt.Errorf("read kubelet config: %w", err)
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
