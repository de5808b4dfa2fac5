package kubelet

import (
	"fmt"
	"strconv"
	"strings"
)

// Taint effects the kubelet accepts. They are case-sensitive: "noexecute" is rejected.
const (
	effectNoSchedule       = "NoSchedule"
	effectPreferNoSchedule = "PreferNoSchedule"
	effectNoExecute        = "NoExecute"
)

// validEffects lists the effects in the order they are suggested in messages.
var validEffects = []string{effectNoSchedule, effectPreferNoSchedule, effectNoExecute}

// Taint is a startup taint the kubelet registers its Node with. It mirrors the three fields of
// the Kubernetes taint the kubelet builds from --register-with-taints, without importing the
// Kubernetes API (collectors stay free of it).
type Taint struct {
	// Key is a qualified name: an optional DNS-subdomain prefix and '/', then a name.
	Key string
	// Value is optional; when set it follows the label-value rules.
	Value string
	// Effect is NoSchedule, PreferNoSchedule or NoExecute; empty only in expectations that
	// match any effect.
	Effect string
}

// String renders the taint in the kubelet flag syntax, key[=value][:Effect], so it can be
// pasted into --register-with-taints.
func (t Taint) String() string {
	var b strings.Builder
	b.WriteString(t.Key)
	if t.Value != "" {
		b.WriteByte('=')
		b.WriteString(t.Value)
	}
	if t.Effect != "" {
		b.WriteByte(':')
		b.WriteString(t.Effect)
	}
	return b.String()
}

// Problem is one thing wrong with the taints the kubelet registers: an entry it will
// reject or silently drop (Reason ReasonStartupTaintMalformed), or an expected startup
// taint it does not register (ReasonStartupTaintMissing). Message names the entry and
// the exact fix, so an operator can copy it into the node's bootstrap configuration.
type Problem struct {
	// Entry is the offending entry exactly as the kubelet received it (for a missing
	// taint, the expected taint).
	Entry string
	// Reason is ReasonStartupTaintMalformed or ReasonStartupTaintMissing.
	Reason string
	// Message says what is wrong and how to fix it.
	Message string
	// Effect is what the entry does to the kubelet; EffectNone for a missing taint.
	Effect ProblemEffect
}

// ProblemEffect is what a malformed entry does to the node, so messages and verdicts can say
// "the kubelet exits" apart from "the node never registers" and "the entry is dropped".
type ProblemEffect int

const (
	// EffectNone: not a malformed entry (a missing expected taint).
	EffectNone ProblemEffect = iota
	// EffectKubeletExits: the kubelet refuses the flag or its configuration file and exits
	// at once (systemd restarts it every RestartSec, forever).
	EffectKubeletExits
	// EffectRegistrationRejected: the kubelet starts, but the API server rejects the Node it
	// registers (an empty effect, or a key and effect repeated), so the node never appears.
	EffectRegistrationRejected
	// EffectIgnored: the kubelet accepts the entry and silently drops it (kubectl's removal
	// syntax "key-" or "key:Effect-").
	EffectIgnored
)

// String names the consequence for messages.
func (e ProblemEffect) String() string {
	switch e {
	case EffectKubeletExits:
		return "the kubelet refuses it and exits at start"
	case EffectRegistrationRejected:
		return "the kubelet starts but the API server rejects the Node registration"
	case EffectIgnored:
		return "the kubelet silently ignores it"
	}
	return ""
}

// entryIssue is the first thing found wrong with one --register-with-taints entry. kind
// selects the wording of the fix; detail is the human explanation.
type entryIssue struct {
	kind   issueKind
	detail string
}

type issueKind int

const (
	issueNone issueKind = iota
	issueEmpty
	issueQuotes
	issueWhitespace
	issueRemoval
	issueSyntax
	issueNoEffect
	issueBadEffect
	issueBadKey
	issueBadValue
	issueDuplicate
)

// ParseRegisterWithTaints parses the value of the kubelet's --register-with-taints flag (a
// comma-separated list of key[=value]:Effect) exactly as the kubelet does
// (k8s.io/kubernetes pkg/util/flag RegisterWithTaintsVar.Set, which splits at ',' and calls
// pkg/util/taints.ParseTaints), but instead of stopping at the first error it returns every
// entry the kubelet would register and one Problem per entry it would reject or drop. The
// accepted language is the kubelet's: a taint is accepted here if and only if the kubelet
// accepts it (the differential fuzz test in internal/difffuzz proves it against the
// upstream code). What is added is the wording: literal quote characters left over from
// shell quoting (`--register-with-taints="k=v:NoExecute"` passed through ${VAR}),
// whitespace from several flags passed as one argument, a trailing '-' (kubectl's removal
// syntax, which the kubelet parses and drops), effects in the wrong case. When every entry
// can be repaired mechanically, each message carries the full corrected flag.
//
// The kubelet rejects the whole flag when one entry is bad (it exits at start), so the
// returned taints are only registered when no Problem has Effect EffectKubeletExits.
//
// It is pure (no I/O) so it can be fuzzed and reused by the one-shot check command.
func ParseRegisterWithTaints(raw string) ([]Taint, []Problem) {
	if raw == "" {
		return nil, nil
	}
	entries := strings.Split(raw, ",")
	fix, fixDone := "", false // the corrected flag, computed once and only if needed

	var (
		taints   []Taint
		problems []Problem
		seen     = make(map[string]bool, len(entries))
	)
	for _, entry := range entries {
		t, issue := parseEntry(entry)
		if issue.kind == issueNone {
			id := t.Key + ":" + t.Effect
			if seen[id] {
				issue = entryIssue{kind: issueDuplicate, detail: fmt.Sprintf("repeats key %q with effect %s", t.Key, t.Effect)}
			} else {
				seen[id] = true
				taints = append(taints, t)
				continue
			}
		}
		if !fixDone {
			fix, fixDone = repairedFlag(entries), true
		}
		effect := EffectKubeletExits
		if issue.kind == issueRemoval {
			effect = EffectIgnored
		}
		problems = append(problems, Problem{
			Entry:   entry,
			Reason:  ReasonStartupTaintMalformed,
			Message: flagProblemMessage(entry, issue, fix, effect),
			Effect:  effect,
		})
	}
	return taints, problems
}

// parseEntry parses one flag entry strictly and reports the first issue found. The order of
// the checks matters: the most fundamental mistake (quoting) is reported before the damage
// it causes downstream (an effect of `NoExecute"`). Quote characters and whitespace can
// never be part of a valid key, value or effect, so reporting them first changes the
// wording, never the verdict.
func parseEntry(entry string) (Taint, entryIssue) {
	switch {
	case entry == "":
		return Taint{}, entryIssue{kind: issueEmpty, detail: "is empty (a doubled or trailing comma)"}
	case strings.ContainsAny(entry, "\"'`"):
		return Taint{}, entryIssue{kind: issueQuotes, detail: "has quote characters inside the value: " + seenAs(entry)}
	case strings.ContainsAny(entry, " \t\r\n\v\f"):
		return Taint{}, entryIssue{kind: issueWhitespace, detail: "contains whitespace (several arguments were passed to the kubelet as one)"}
	case strings.HasSuffix(entry, "-"):
		// ParseTaints treats "spec-" as a taint to remove: it must parse (effect optional),
		// and is then dropped by the kubelet.
		if _, issue := parseTaintSpec(strings.TrimSuffix(entry, "-"), false); issue.kind != issueNone {
			return Taint{}, issue
		}
		return Taint{}, entryIssue{kind: issueRemoval, detail: "ends with '-', kubectl's syntax for removing a taint, which the kubelet parses and then ignores"}
	}
	return parseTaintSpec(entry, true)
}

// seenAs describes how the kubelet splits a spec, to show where stray characters ended up.
func seenAs(spec string) string {
	kv, effect, hasEffect := strings.Cut(spec, ":")
	key, value, hasValue := strings.Cut(kv, "=")
	if !hasEffect {
		return fmt.Sprintf("the kubelet sees the taint key %q", spec)
	}
	if hasValue {
		return fmt.Sprintf("the kubelet sees the taint key %q, value %q and effect %q", key, value, effect)
	}
	return fmt.Sprintf("the kubelet sees the taint key %q and effect %q", key, effect)
}

// parseTaintSpec parses key[=value][:effect] with the rules of the kubelet's parseTaint:
// without ':' the whole spec is the key (so "key=value" has an invalid key); with one ':'
// the effect must be valid, the part before it is key[=value] and the value, when present,
// a label value (empty is valid: "key=:NoSchedule"). requireEffect is false for removal
// specs and expectations, where a bare key is allowed.
func parseTaintSpec(spec string, requireEffect bool) (Taint, entryIssue) {
	var t Taint
	kv, effect, hasEffect := strings.Cut(spec, ":")
	if hasEffect && strings.Contains(effect, ":") {
		return t, entryIssue{kind: issueSyntax, detail: "has more than one ':'; the syntax is key[=value]:Effect"}
	}
	key, value, hasValue := strings.Cut(kv, "=")
	if hasValue && strings.Contains(value, "=") {
		return t, entryIssue{kind: issueSyntax, detail: "has more than one '='; the syntax is key[=value]:Effect"}
	}
	t = Taint{Key: key, Value: value, Effect: effect}
	if !hasEffect && (requireEffect || hasValue) {
		return t, entryIssue{kind: issueNoEffect, detail: "has no effect"}
	}
	if hasEffect {
		if issue := checkEffect(effect); issue.kind != issueNone {
			return t, issue
		}
	}
	if msg := qualifiedNameError(key); msg != "" {
		return t, entryIssue{kind: issueBadKey, detail: fmt.Sprintf("has an invalid key %q: %s", key, msg)}
	}
	if msg := labelValueError(value); msg != "" {
		return t, entryIssue{kind: issueBadValue, detail: fmt.Sprintf("has an invalid value %q: %s", value, msg)}
	}
	return t, entryIssue{}
}

// checkEffect reports an effect that is not one of the three the kubelet accepts.
func checkEffect(effect string) entryIssue {
	if isValidEffect(effect) {
		return entryIssue{}
	}
	if effect == "" {
		return entryIssue{kind: issueNoEffect, detail: "has an empty effect after ':'"}
	}
	if fixed := effectFold(effect); fixed != "" {
		return entryIssue{kind: issueBadEffect, detail: fmt.Sprintf("has effect %q, but effects are case-sensitive (%s)", effect, fixed)}
	}
	return entryIssue{kind: issueBadEffect, detail: fmt.Sprintf("has effect %q, which is not one of %s", effect, strings.Join(validEffects, ", "))}
}

func isValidEffect(effect string) bool {
	return effect == effectNoSchedule || effect == effectPreferNoSchedule || effect == effectNoExecute
}

// effectFold returns the valid effect that equals effect ignoring case, or "".
func effectFold(effect string) string {
	for _, e := range validEffects {
		if strings.EqualFold(e, effect) {
			return e
		}
	}
	return ""
}

// repairEntry applies the mechanical fixes an operator would apply by hand: drop quote
// characters and surrounding whitespace, drop a trailing '-', drop an '=' without a value,
// fix the case of the effect. It reports false when what is left is still not a valid taint
// (a bad key, no effect, an unknown effect): those need a human decision.
func repairEntry(entry string) (Taint, bool) {
	s := strings.Map(func(r rune) rune {
		if r == '"' || r == '\'' || r == '`' {
			return -1
		}
		return r
	}, entry)
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(s, "-")
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return Taint{}, false
	}
	kv, effect, ok := strings.Cut(s, ":")
	if !ok {
		return Taint{}, false
	}
	if fixed := effectFold(effect); fixed != "" {
		effect = fixed
	}
	kv = strings.TrimSuffix(kv, "=")
	t, issue := parseTaintSpec(kv+":"+effect, true)
	return t, issue.kind == issueNone
}

// repairedFlag returns the whole corrected flag (`--register-with-taints=...`) when every
// non-empty entry can be repaired, or "" when at least one needs a human decision. Empty
// entries are dropped and duplicates collapsed, as the fix for them is to remove them.
func repairedFlag(entries []string) string {
	var (
		parts []string
		seen  = make(map[string]bool, len(entries))
	)
	for _, e := range entries {
		if strings.TrimSpace(strings.Trim(e, "\"'`")) == "" {
			continue
		}
		t, ok := repairEntry(e)
		if !ok {
			return ""
		}
		if id := t.Key + ":" + t.Effect; !seen[id] {
			seen[id] = true
			parts = append(parts, t.String())
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "--register-with-taints=" + strings.Join(parts, ",")
}

// flagProblemMessage words one flag problem with its fix. fix is the full corrected flag or "".
func flagProblemMessage(entry string, issue entryIssue, fix string, effect ProblemEffect) string {
	prefix := fmt.Sprintf("--register-with-taints entry %q %s", entry, issue.detail)
	if effect == EffectKubeletExits {
		prefix += "; the kubelet rejects the whole flag and exits"
	}
	if fix != "" {
		switch issue.kind {
		case issueQuotes:
			return fmt.Sprintf("%s; pass %s without inner quotes", prefix, fix)
		case issueWhitespace:
			return fmt.Sprintf("%s; pass %s as a single argument of its own", prefix, fix)
		default:
			return fmt.Sprintf("%s; pass %s", prefix, fix)
		}
	}
	switch issue.kind {
	case issueQuotes:
		return prefix + "; remove the quote characters from the value passed to the kubelet"
	case issueNoEffect:
		return prefix + "; every registered taint needs key[=value]:Effect with Effect one of " + strings.Join(validEffects, ", ") + ", e.g. " + suggestWithEffect(entry)
	case issueBadEffect:
		return prefix + "; use one of " + strings.Join(validEffects, ", ")
	case issueBadKey:
		return prefix + "; a taint key is an optional DNS-subdomain prefix and '/' followed by a name of at most 63 characters from [A-Za-z0-9._-] that starts and ends with a letter or digit"
	case issueBadValue:
		return prefix + "; a taint value has at most 63 characters from [A-Za-z0-9._-] and starts and ends with a letter or digit"
	default:
		return prefix + "; the syntax is --register-with-taints=key[=value]:Effect[,key[=value]:Effect...]"
	}
}

// suggestWithEffect renders an example for an entry that lacks an effect.
func suggestWithEffect(entry string) string {
	e := strings.TrimSpace(strings.Trim(entry, "\"'`"))
	e = strings.TrimSuffix(strings.TrimSuffix(e, ":"), "=")
	if e == "" {
		e = "key"
	}
	return "--register-with-taints=" + e + ":" + effectNoSchedule
}

// ValidateConfigTaints checks the registerWithTaints entries of a kubelet configuration
// file the way the kubelet and the API server do, returning one Problem per entry that is
// refused (Problem.Entry is the entry's index, as a decimal string). The kubelet validates
// its configuration at start (pkg/kubelet/apis/config/validation: key a qualified name, a
// non-empty value a label value, a non-empty effect one of the three) and exits when that
// fails; what passes is registered with the Node, which the API server validates again
// (pkg/apis/core/validation validateNodeTaints: the effect is required, and key and effect
// must be unique), rejecting the registration. Problem.Message is the bare explanation; the
// caller adds the file and the fix.
func ValidateConfigTaints(taints []Taint) []Problem {
	var problems []Problem
	seen := make(map[string]bool, len(taints))
	for i, t := range taints {
		detail, effect := configTaintIssue(t)
		if effect == EffectNone {
			id := t.Key + ":" + t.Effect
			if seen[id] {
				detail, effect = fmt.Sprintf("repeats key %q with effect %s", t.Key, t.Effect), EffectRegistrationRejected
			}
			seen[id] = true
		}
		if effect != EffectNone {
			problems = append(problems, Problem{Entry: strconv.Itoa(i), Reason: ReasonStartupTaintMalformed, Message: detail, Effect: effect})
		}
	}
	return problems
}

// configTaintIssue returns why one structured taint is refused, and by whom.
func configTaintIssue(t Taint) (string, ProblemEffect) {
	if msg := qualifiedNameError(t.Key); msg != "" {
		if strings.ContainsAny(t.Key, "\"'`") {
			return fmt.Sprintf("has quote characters in its key %q", t.Key), EffectKubeletExits
		}
		return fmt.Sprintf("has an invalid key %q: %s", t.Key, msg), EffectKubeletExits
	}
	if msg := labelValueError(t.Value); msg != "" {
		return fmt.Sprintf("has an invalid value %q: %s", t.Value, msg), EffectKubeletExits
	}
	if t.Effect == "" {
		return "has no effect", EffectRegistrationRejected
	}
	if issue := checkEffect(t.Effect); issue.kind != issueNone {
		return issue.detail, EffectKubeletExits
	}
	return "", EffectNone
}

// ParseExpectedTaint parses one expected startup taint as written in the agent's
// configuration: "key", "key:Effect" or "key=value:Effect". A bare key matches a registered
// taint with that key and any effect.
func ParseExpectedTaint(spec string) (Taint, error) {
	t, issue := parseTaintSpec(spec, false)
	if issue.kind != issueNone {
		return Taint{}, fmt.Errorf("expected taint %q %s; write it as key, key:Effect or key=value:Effect", spec, issue.detail)
	}
	return t, nil
}

// Name rules of Kubernetes qualified names and label values, reimplemented here because the
// collectors do not import the Kubernetes API machinery.
const (
	maxNameLen      = 63
	maxSubdomainLen = 253
)

// qualifiedNameError returns why s is not a qualified name ([prefix/]name), or "".
func qualifiedNameError(s string) string {
	if s == "" {
		return "must not be empty"
	}
	name := s
	if prefix, rest, ok := strings.Cut(s, "/"); ok {
		if strings.Contains(rest, "/") {
			return "must contain at most one '/'"
		}
		if msg := dnsSubdomainError(prefix); msg != "" {
			return "prefix " + msg
		}
		name = rest
	}
	if name == "" {
		return "name part must not be empty"
	}
	if len(name) > maxNameLen {
		return fmt.Sprintf("name part must be at most %d characters, got %d", maxNameLen, len(name))
	}
	if !isAlnum(name[0]) || !isAlnum(name[len(name)-1]) {
		return "name part must start and end with a letter or digit"
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return fmt.Sprintf("name part must consist of letters, digits, '-', '_' or '.', found %q", c)
		}
	}
	return ""
}

// dnsSubdomainError returns why s is not a lower-case RFC 1123 subdomain, or "".
func dnsSubdomainError(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if len(s) > maxSubdomainLen {
		return fmt.Sprintf("must be at most %d characters", maxSubdomainLen)
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" {
			return "must not contain empty labels"
		}
		if !isLowerAlnum(label[0]) || !isLowerAlnum(label[len(label)-1]) {
			return "labels must start and end with a lower-case letter or digit"
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !isLowerAlnum(c) && c != '-' {
				return fmt.Sprintf("must consist of lower-case letters, digits, '-' or '.', found %q", c)
			}
		}
	}
	return ""
}

// labelValueError returns why s is not a label value (empty is valid), or "".
func labelValueError(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > maxNameLen {
		return fmt.Sprintf("must be at most %d characters, got %d", maxNameLen, len(s))
	}
	if !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return "must start and end with a letter or digit"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return fmt.Sprintf("must consist of letters, digits, '-', '_' or '.', found %q", c)
		}
	}
	return ""
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func isLowerAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}
