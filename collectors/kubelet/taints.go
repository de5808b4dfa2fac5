package kubelet

import (
	"fmt"
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
	issueEmptyValue
	issueBadValue
	issueDuplicate
)

// ParseRegisterWithTaints parses the value of the kubelet's --register-with-taints flag (a
// comma-separated list of key[=value]:Effect) the way the kubelet does, but instead of
// stopping at the first error it returns every entry the kubelet would accept and one
// Problem per entry it would reject or ignore. The checks are stricter than "does it parse"
// in the ways that bite on real nodes: literal quote characters left over from shell quoting
// (`--kubelet-extra-args='--register-with-taints="k=v:NoExecute"'`), whitespace from several
// flags passed as one argument, a trailing '-' (kubectl's removal syntax, which the kubelet
// drops), `key=` without a value, and effects in the wrong case. When every entry can be
// repaired mechanically, each message carries the full corrected flag.
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
		problems = append(problems, Problem{
			Entry:   entry,
			Reason:  ReasonStartupTaintMalformed,
			Message: flagProblemMessage(entry, issue, fix),
		})
	}
	return taints, problems
}

// parseEntry parses one flag entry strictly and reports the first issue found. The order of
// the checks matters: the most fundamental mistake (quoting) is reported before the damage
// it causes downstream (an effect of `NoExecute"`).
func parseEntry(entry string) (Taint, entryIssue) {
	switch {
	case entry == "":
		return Taint{}, entryIssue{kind: issueEmpty, detail: "is empty (a doubled or trailing comma)"}
	case strings.ContainsAny(entry, "\"'`"):
		return Taint{}, entryIssue{kind: issueQuotes, detail: "has stray quote characters"}
	case strings.ContainsAny(entry, " \t\r\n"):
		return Taint{}, entryIssue{kind: issueWhitespace, detail: "contains whitespace (several arguments were passed to the kubelet as one)"}
	case strings.HasSuffix(entry, "-"):
		return Taint{}, entryIssue{kind: issueRemoval, detail: "ends with '-', kubectl's syntax for removing a taint, which the kubelet ignores"}
	}
	return parseTaintSpec(entry, true)
}

// parseTaintSpec parses key[=value][:effect]. requireEffect is false for expectations, where
// a bare key matches any effect.
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
	if !hasEffect && requireEffect {
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
	if hasValue && value == "" {
		return t, entryIssue{kind: issueEmptyValue, detail: "has '=' but no value (an unset variable?)"}
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
func flagProblemMessage(entry string, issue entryIssue, fix string) string {
	prefix := fmt.Sprintf("--register-with-taints entry %q %s", entry, issue.detail)
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

// validateTaint checks a structured taint (from the kubelet configuration file) with the
// same rules as the flag, returning "" when it is valid.
func validateTaint(t Taint) string {
	if strings.ContainsAny(t.Key+t.Value+t.Effect, "\"'`") {
		return "has stray quote characters"
	}
	if issue := checkEffect(t.Effect); issue.kind != issueNone {
		return issue.detail
	}
	if msg := qualifiedNameError(t.Key); msg != "" {
		return fmt.Sprintf("has an invalid key %q: %s", t.Key, msg)
	}
	if msg := labelValueError(t.Value); msg != "" {
		return fmt.Sprintf("has an invalid value %q: %s", t.Value, msg)
	}
	return ""
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
