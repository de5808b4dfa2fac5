package kubelet

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseRegisterWithTaints(t *testing.T) {
	const exits = "; the kubelet rejects the whole flag and exits"
	tests := []struct {
		name     string
		raw      string
		want     []Taint
		problems []string // substrings, one per expected problem, in order
	}{
		{name: "empty flag", raw: ""},
		{
			name: "single valid",
			raw:  "node.cilium.io/agent-not-ready=true:NoExecute",
			want: []Taint{{Key: "node.cilium.io/agent-not-ready", Value: "true", Effect: "NoExecute"}},
		},
		{
			name: "several valid without values",
			raw:  "a:NoSchedule,example.com/b=x:PreferNoSchedule,c:NoExecute",
			want: []Taint{
				{Key: "a", Effect: "NoSchedule"},
				{Key: "example.com/b", Value: "x", Effect: "PreferNoSchedule"},
				{Key: "c", Effect: "NoExecute"},
			},
		},
		{
			name: "classic double quotes from kubelet-extra-args",
			raw:  `"node.cilium.io/agent-not-ready=true:NoExecute"`,
			problems: []string{`--register-with-taints entry "\"node.cilium.io/agent-not-ready=true:NoExecute\"" has quote characters inside the value: ` +
				`the kubelet sees the taint key "\"node.cilium.io/agent-not-ready", value "true" and effect "NoExecute\""` + exits +
				`; pass --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute without inner quotes`},
		},
		{
			name: "quotes around a list, fix keeps both entries",
			raw:  `"a:NoSchedule,b=1:NoExecute"`,
			problems: []string{
				`entry "\"a:NoSchedule" has quote characters inside the value: the kubelet sees the taint key "\"a" and effect "NoSchedule"` + exits +
					`; pass --register-with-taints=a:NoSchedule,b=1:NoExecute without inner quotes`,
				`entry "b=1:NoExecute\"" has quote characters inside the value: the kubelet sees the taint key "b", value "1" and effect "NoExecute\""` + exits +
					`; pass --register-with-taints=a:NoSchedule,b=1:NoExecute without inner quotes`,
			},
		},
		{
			name:     "single quotes",
			raw:      `'a:NoSchedule'`,
			problems: []string{`the kubelet sees the taint key "'a" and effect "NoSchedule'"` + exits + `; pass --register-with-taints=a:NoSchedule without inner quotes`},
		},
		{
			name: "equals without value is valid, as for the kubelet",
			raw:  "a=:NoSchedule",
			want: []Taint{{Key: "a", Effect: "NoSchedule"}},
		},
		{
			name:     "missing effect",
			raw:      "a=b",
			problems: []string{`entry "a=b" has no effect` + exits + `; every registered taint needs key[=value]:Effect with Effect one of NoSchedule, PreferNoSchedule, NoExecute, e.g. --register-with-taints=a=b:NoSchedule`},
		},
		{
			name:     "empty effect",
			raw:      "a:",
			problems: []string{`entry "a:" has an empty effect after ':'`},
		},
		{
			name:     "wrong-case effect is repaired",
			raw:      "a:noexecute",
			problems: []string{`has effect "noexecute", but effects are case-sensitive (NoExecute)` + exits + `; pass --register-with-taints=a:NoExecute`},
		},
		{
			name:     "unknown effect",
			raw:      "a:Evict",
			problems: []string{`has effect "Evict", which is not one of NoSchedule, PreferNoSchedule, NoExecute` + exits + `; use one of`},
		},
		{
			name:     "bad key prefix upper case",
			raw:      "Example.COM/a:NoSchedule",
			problems: []string{`has an invalid key "Example.COM/a": prefix labels must start and end with a lower-case letter or digit`},
		},
		{
			name:     "key name too long",
			raw:      strings.Repeat("k", 64) + ":NoSchedule",
			problems: []string{"name part must be at most 63 characters, got 64"},
		},
		{
			name:     "key starts with dash",
			raw:      "-a:NoSchedule",
			problems: []string{"name part must start and end with a letter or digit"},
		},
		{
			name:     "two slashes",
			raw:      "a/b/c:NoSchedule",
			problems: []string{"must contain at most one '/'"},
		},
		{
			name:     "bad value",
			raw:      "a=b$c:NoSchedule",
			problems: []string{`has an invalid value "b$c"`},
		},
		{
			name:     "two colons",
			raw:      "a:b:NoSchedule",
			problems: []string{"has more than one ':'"},
		},
		{
			name:     "two equals",
			raw:      "a=b=c:NoSchedule",
			problems: []string{"has more than one '='"},
		},
		{
			name:     "removal syntax",
			raw:      "a:NoSchedule-",
			problems: []string{"ends with '-', kubectl's syntax for removing a taint, which the kubelet parses and then ignores; pass --register-with-taints=a:NoSchedule"},
		},
		{
			name:     "trailing comma",
			raw:      "a:NoSchedule,",
			want:     []Taint{{Key: "a", Effect: "NoSchedule"}},
			problems: []string{`entry "" is empty (a doubled or trailing comma)` + exits + `; pass --register-with-taints=a:NoSchedule`},
		},
		{
			name:     "whitespace from two flags in one argument",
			raw:      "a:NoSchedule --node-labels=x=y",
			problems: []string{"contains whitespace"},
		},
		{
			name:     "duplicate key and effect",
			raw:      "a=1:NoSchedule,a=2:NoSchedule",
			want:     []Taint{{Key: "a", Value: "1", Effect: "NoSchedule"}},
			problems: []string{`repeats key "a" with effect NoSchedule`},
		},
		{
			name: "same key different effects is fine",
			raw:  "a:NoSchedule,a:NoExecute",
			want: []Taint{{Key: "a", Effect: "NoSchedule"}, {Key: "a", Effect: "NoExecute"}},
		},
		{
			name:     "valid and malformed mixed: fix needs a human",
			raw:      "a:NoSchedule,b:Bogus",
			want:     []Taint{{Key: "a", Effect: "NoSchedule"}},
			problems: []string{`entry "b:Bogus" has effect "Bogus"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, problems := ParseRegisterWithTaints(tt.raw)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("taints = %#v, want %#v", got, tt.want)
			}
			if len(problems) != len(tt.problems) {
				t.Fatalf("got %d problems %+v, want %d", len(problems), problems, len(tt.problems))
			}
			for i, p := range problems {
				if p.Reason != ReasonStartupTaintMalformed {
					t.Errorf("problem %d reason = %q", i, p.Reason)
				}
				if !strings.Contains(p.Message, tt.problems[i]) {
					t.Errorf("problem %d message\n  %s\nwant it to contain\n  %s", i, p.Message, tt.problems[i])
				}
			}
		})
	}
}

func TestParseRegisterWithTaintsExactMessage(t *testing.T) {
	// The message of the classic mistake is part of the product: keep it byte-exact.
	_, problems := ParseRegisterWithTaints(`"node.cilium.io/agent-not-ready=true:NoExecute"`)
	want := `--register-with-taints entry "\"node.cilium.io/agent-not-ready=true:NoExecute\"" has quote characters inside the value: ` +
		`the kubelet sees the taint key "\"node.cilium.io/agent-not-ready", value "true" and effect "NoExecute\""; ` +
		`the kubelet rejects the whole flag and exits; pass --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute without inner quotes`
	if len(problems) != 1 || problems[0].Message != want {
		t.Fatalf("problems = %+v\nwant one with message\n%s", problems, want)
	}
}

func TestQualifiedNameError(t *testing.T) {
	tests := []struct {
		key   string
		valid bool
	}{
		{"a", true},
		{"A.b-c_D9", true},
		{"node.kubernetes.io/not-ready", true},
		{"readiness.k8s.io/network", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 253) + "/x", true},
		{"", false},
		{"/a", false},
		{"a/", false},
		{"a_b.com/x", false},
		{"a..b/x", false},
		{".a/x", false},
		{strings.Repeat("a", 64), false},
		{strings.Repeat("a", 254) + "/x", false},
		{"a b", false},
		{"a:b", false},
		{"ünïcode", false},
	}
	for _, tt := range tests {
		msg := qualifiedNameError(tt.key)
		if (msg == "") != tt.valid {
			t.Errorf("qualifiedNameError(%q) = %q, want valid=%v", tt.key, msg, tt.valid)
		}
	}
}

func TestParseExpectedTaint(t *testing.T) {
	tests := []struct {
		spec    string
		want    Taint
		wantErr string
	}{
		{spec: "node.cilium.io/agent-not-ready", want: Taint{Key: "node.cilium.io/agent-not-ready"}},
		{spec: "a:NoExecute", want: Taint{Key: "a", Effect: "NoExecute"}},
		{spec: "a=b:NoSchedule", want: Taint{Key: "a", Value: "b", Effect: "NoSchedule"}},
		{spec: "a:noschedule", wantErr: "case-sensitive"},
		{spec: "", wantErr: "must not be empty"},
		{spec: `"a"`, wantErr: "invalid key"},
	}
	for _, tt := range tests {
		got, err := ParseExpectedTaint(tt.spec)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseExpectedTaint(%q) err = %v, want containing %q", tt.spec, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseExpectedTaint(%q) = %+v, %v; want %+v", tt.spec, got, err, tt.want)
		}
	}
}

func TestTaintString(t *testing.T) {
	for _, tt := range []struct {
		t    Taint
		want string
	}{
		{Taint{Key: "a"}, "a"},
		{Taint{Key: "a", Effect: "NoSchedule"}, "a:NoSchedule"},
		{Taint{Key: "a", Value: "v", Effect: "NoExecute"}, "a=v:NoExecute"},
	} {
		if got := tt.t.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.t, got, tt.want)
		}
	}
}

// TestParseRegisterWithTaintsEffects pins what each kind of entry does to the kubelet, per
// k8s.io/kubernetes pkg/util/taints.ParseTaints as called by the --register-with-taints flag.
func TestParseRegisterWithTaintsEffects(t *testing.T) {
	tests := []struct {
		raw     string
		taints  int
		effects []ProblemEffect
	}{
		{raw: "a=:NoSchedule", taints: 1},
		{raw: "a:NoSchedule,a:NoExecute,a=x:PreferNoSchedule", taints: 3},
		{raw: "a-", effects: []ProblemEffect{EffectIgnored}},
		{raw: "a:NoExecute-", effects: []ProblemEffect{EffectIgnored}},
		{raw: "a=v:NoExecute-", effects: []ProblemEffect{EffectIgnored}},
		{raw: "-", effects: []ProblemEffect{EffectKubeletExits}},
		{raw: "a=v-", effects: []ProblemEffect{EffectKubeletExits}}, // no ':': the key is "a=v"
		{raw: "a:-", effects: []ProblemEffect{EffectKubeletExits}},
		{raw: "a", effects: []ProblemEffect{EffectKubeletExits}},
		{raw: "a=v", effects: []ProblemEffect{EffectKubeletExits}},
		{raw: "a:NoSchedule,a=v:NoSchedule", taints: 1, effects: []ProblemEffect{EffectKubeletExits}},
		{raw: "a:NoSchedule,", taints: 1, effects: []ProblemEffect{EffectKubeletExits}},
		{raw: "A/b:NoSchedule", effects: []ProblemEffect{EffectKubeletExits}},
	}
	for _, tt := range tests {
		taints, problems := ParseRegisterWithTaints(tt.raw)
		var got []ProblemEffect
		for _, p := range problems {
			got = append(got, p.Effect)
		}
		if len(taints) != tt.taints || !reflect.DeepEqual(got, tt.effects) {
			t.Errorf("%q: %d taints, effects %v; want %d, %v", tt.raw, len(taints), got, tt.taints, tt.effects)
		}
	}
}

func TestValidateConfigTaints(t *testing.T) {
	problems := ValidateConfigTaints([]Taint{
		{Key: "a", Effect: "NoSchedule"},
		{Key: "a", Value: "x", Effect: "NoSchedule"}, // duplicate key and effect
		{Key: "b"},                         // no effect
		{Key: "c", Effect: "noSchedule"},   // bad effect
		{Key: `"d"`, Effect: "NoSchedule"}, // quotes in the key
		{Key: "e", Value: "-x", Effect: "NoSchedule"},
		{Key: "f", Value: "", Effect: "NoExecute"},
	})
	want := map[string]ProblemEffect{"1": EffectRegistrationRejected, "2": EffectRegistrationRejected, "3": EffectKubeletExits, "4": EffectKubeletExits, "5": EffectKubeletExits}
	got := map[string]ProblemEffect{}
	for _, p := range problems {
		got[p.Entry] = p.Effect
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems %+v\nwant effects %v", problems, want)
	}
}
