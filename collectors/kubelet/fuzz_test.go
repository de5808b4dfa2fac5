package kubelet

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// checkParsed asserts the properties every ParseRegisterWithTaints answer must have.
func checkParsed(t *testing.T, raw string, taints []Taint, problems []Problem) {
	t.Helper()
	if raw == "" {
		if len(taints) != 0 || len(problems) != 0 {
			t.Fatalf("empty flag gave %v %v", taints, problems)
		}
		return
	}
	if got, want := len(taints)+len(problems), strings.Count(raw, ",")+1; got != want {
		t.Fatalf("%q: %d taints + problems for %d entries", raw, got, want)
	}
	seen := map[string]bool{}
	for _, tn := range taints {
		if !isValidEffect(tn.Effect) {
			t.Fatalf("%q: accepted taint %+v has invalid effect", raw, tn)
		}
		if msg := qualifiedNameError(tn.Key); msg != "" {
			t.Fatalf("%q: accepted taint %+v has invalid key: %s", raw, tn, msg)
		}
		if msg := labelValueError(tn.Value); msg != "" {
			t.Fatalf("%q: accepted taint %+v has invalid value: %s", raw, tn, msg)
		}
		if id := tn.Key + ":" + tn.Effect; seen[id] {
			t.Fatalf("%q: accepted duplicate %+v", raw, tn)
		} else {
			seen[id] = true
		}
	}
	// What was accepted renders back to a flag that parses to the same taints.
	if len(taints) > 0 {
		parts := make([]string, len(taints))
		for i, tn := range taints {
			parts[i] = tn.String()
		}
		again, probs := ParseRegisterWithTaints(strings.Join(parts, ","))
		if len(probs) != 0 || len(again) != len(taints) {
			t.Fatalf("%q: re-parsing accepted taints gave %v %v", raw, again, probs)
		}
		for i := range again {
			if again[i] != taints[i] {
				t.Fatalf("%q: round trip changed %+v into %+v", raw, taints[i], again[i])
			}
		}
	}
	for _, p := range problems {
		if p.Reason != ReasonStartupTaintMalformed || !strings.HasPrefix(p.Message, "--register-with-taints entry ") {
			t.Fatalf("%q: bad problem %+v", raw, p)
		}
		// A suggested fix must itself be a clean flag.
		const marker = "pass --register-with-taints="
		if i := strings.Index(p.Message, marker); i >= 0 {
			fix := p.Message[i+len(marker):]
			if j := strings.IndexByte(fix, ' '); j >= 0 {
				fix = fix[:j]
			}
			if _, probs := ParseRegisterWithTaints(fix); len(probs) != 0 || fix == "" {
				t.Fatalf("%q: suggested fix %q is itself malformed: %+v", raw, fix, probs)
			}
		}
	}
}

func FuzzParseRegisterWithTaints(f *testing.F) {
	for _, seed := range []string{
		"",
		"node.cilium.io/agent-not-ready=true:NoExecute",
		`"node.cilium.io/agent-not-ready=true:NoExecute"`,
		`'a:NoSchedule,b=1:NoExecute'`,
		"a=:NoSchedule",
		"a:noexecute,a:NoExecute",
		"a:NoSchedule-",
		"a:NoSchedule --node-labels=x=y",
		"a:b:c,=,:,,",
		"example.com/" + strings.Repeat("x", 70) + ":NoSchedule",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		taints, problems := ParseRegisterWithTaints(raw)
		checkParsed(t, raw, taints, problems)
	})
}

func FuzzKubeletCmdline(f *testing.F) {
	for _, seed := range [][]byte{
		[]byte("/usr/bin/kubelet\x00--config=/etc/kubernetes/kubelet/config.yaml\x00--register-with-taints=a:NoSchedule\x00"),
		[]byte("/usr/bin/kubelet\x00--register-with-taints=\"node.cilium.io/agent-not-ready=true:NoExecute\"\x00"),
		[]byte("kubelet\x00\"--register-with-taints\x00a:NoSchedule'\x00"),
		[]byte("kubelet\x00--register-with-taints"),
		[]byte("\x00\x00\x00"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, cmdline []byte) {
		// Split exactly as procfs.Proc.CmdLine does.
		if len(cmdline) == 0 {
			return
		}
		args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
		flags := parseKubeletArgs(args)
		if !flags.taintsSet && flags.taints != "" {
			t.Fatalf("taints %q without taintsSet", flags.taints)
		}
		taints, problems := ParseRegisterWithTaints(flags.taints)
		checkParsed(t, flags.taints, taints, problems)
	})
}

// FuzzUnitParsers feeds arbitrary bytes to the systemd unit, environment-file and word
// parsers: they must never panic, and on input without quotes or backslashes every word
// splitter must agree with plain whitespace splitting.
func FuzzUnitParsers(f *testing.F) {
	for _, seed := range []string{
		"[Service]\nEnvironment='KUBELET_EXTRA_ARGS=--register-with-taints=\"a:NoSchedule\"'\nExecStart=/usr/bin/kubelet \\\n  $KUBELET_EXTRA_ARGS ${X} $$Y\n",
		"NODEADM_KUBELET_ARGS=--a=1 --b=\"2 3\"\n# c\nX='y' z\\\n w\n",
		"A=\"unterminated\nB=\\",
		"ONE='one' \"TWO='two two' too\" THREE=",
		"a\\x4 \\0 \\777 \\",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		assigns := parseUnitFile("f", []byte(s))
		env := map[string]envVar{}
		for _, kv := range parseEnvFile([]byte(s)) {
			if !validEnvName(kv.key) {
				t.Fatalf("invalid key %q accepted", kv.key)
			}
			env[kv.key] = envVar{value: kv.value}
		}
		for _, a := range assigns {
			words, _ := extractWords(a.value, true, true)
			_ = expandArgv(words, env, origin{})
			_, _ = splitLegacy(a.value)
		}
		if !strings.ContainsAny(s, "\"'\\") {
			want := strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' })
			if len(want) == 0 {
				want = nil
			}
			got, err := extractWords(s, true, false)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("extractWords(%q) = %q, %v; want %q", s, got, err, want)
			}
			legacy, err := splitLegacy(s)
			if err != nil || !reflect.DeepEqual(legacy, want) {
				t.Fatalf("splitLegacy(%q) = %q, %v; want %q", s, legacy, err, want)
			}
		}
	})
}
