// Package difffuzz fuzzes the kubelet-config check's taint grammar against the upstream
// Kubernetes code it reimplements, so "the check accepts exactly what the kubelet accepts"
// is a tested fact rather than a claim. It is a test-only module (see go.mod).
package difffuzz

import (
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	core "k8s.io/kubernetes/pkg/apis/core"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	utilflag "k8s.io/kubernetes/pkg/util/flag"
	utiltaints "k8s.io/kubernetes/pkg/util/taints"

	"github.com/nodevigil/nodevigil/collectors/kubelet"
)

var flagSeeds = []string{
	"",
	"a",
	"a-",
	"-",
	"a:NoSchedule",
	"a=:NoSchedule",
	"a=b:NoSchedule-",
	"a=b-",
	"a:-",
	"a:NoSchedule,a:NoSchedule",
	"a:NoSchedule,a=x:NoSchedule",
	"a:NoSchedule,a:NoExecute",
	"a:noschedule",
	"a:NoSchedule,",
	",a:NoSchedule",
	`"node.cilium.io/agent-not-ready=true:NoExecute"`,
	"node.cilium.io/agent-not-ready=true:NoExecute",
	"example.com/" + strings.Repeat("x", 63) + ":PreferNoSchedule",
	"example.com/" + strings.Repeat("x", 64) + ":PreferNoSchedule",
	strings.Repeat("a", 254) + "/x:NoSchedule",
	"A.com/x:NoSchedule",
	"a/b/c:NoSchedule",
	"/a:NoSchedule",
	"a/:NoSchedule",
	"a=" + strings.Repeat("v", 64) + ":NoSchedule",
	"a=-v:NoSchedule",
	"a=v_.-1:NoSchedule",
	"a=b=c:NoSchedule",
	"a:b:NoSchedule",
	"a:NoSchedule --node-labels=x=y",
	"ü:NoSchedule",
}

// FuzzRegisterWithTaintsFlag compares ParseRegisterWithTaints with the kubelet's own
// --register-with-taints flag value (pkg/util/flag RegisterWithTaintsVar.Set, which calls
// pkg/util/taints.ParseTaints): the kubelet refuses the flag exactly when the check reports
// an entry with EffectKubeletExits; otherwise both register the same taints in the same
// order, the check's only other problems are the removal entries the kubelet drops, and
// what is registered passes the API server's Node validation.
func FuzzRegisterWithTaintsFlag(f *testing.F) {
	for _, s := range flagSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var upstream []v1.Taint
		err := utilflag.RegisterWithTaintsVar{Value: &upstream}.Set(raw)

		taints, problems := kubelet.ParseRegisterWithTaints(raw)
		exits, ignored := 0, 0
		for _, p := range problems {
			switch p.Effect {
			case kubelet.EffectKubeletExits:
				exits++
			case kubelet.EffectIgnored:
				ignored++
			default:
				t.Fatalf("%q: flag problem with effect %v: %+v", raw, p.Effect, p)
			}
		}
		if (err != nil) != (exits > 0) {
			t.Fatalf("%q: kubelet error %v, check reports %d fatal problem(s): %+v", raw, err, exits, problems)
		}
		if err != nil {
			return
		}
		got := make([]v1.Taint, len(taints))
		for i, tn := range taints {
			got[i] = v1.Taint{Key: tn.Key, Value: tn.Value, Effect: v1.TaintEffect(tn.Effect)}
		}
		if len(upstream) == 0 && len(got) == 0 {
			upstream, got = nil, nil
		}
		if !reflect.DeepEqual(got, upstream) {
			t.Fatalf("%q: kubelet registers %+v, check says %+v", raw, upstream, got)
		}
		_, removed, _ := utiltaints.ParseTaints(strings.Split(raw, ","))
		if raw == "" {
			removed = nil
		}
		if ignored != len(removed) {
			t.Fatalf("%q: kubelet drops %d removal entries, check reports %d", raw, len(removed), ignored)
		}
		if errs := nodeTaintErrors(upstream); len(errs) > 0 {
			t.Fatalf("%q: taints the kubelet accepts fail Node validation: %v", raw, errs)
		}
	})
}

// FuzzConfigTaints compares ValidateConfigTaints with the kubelet's configuration
// validation (pkg/util/taints.CheckTaintValidation, per entry: EffectKubeletExits) and, for
// what passes it, the API server's Node validation (validateNodeTaints, through
// ValidateNode: EffectRegistrationRejected).
func FuzzConfigTaints(f *testing.F) {
	f.Add("a", "", "NoSchedule", "a", "x", "NoSchedule")
	f.Add("a", "", "", "b", "", "NoExecute")
	f.Add(`"a"`, "v", "NoSchedule", "b", "-v", "noexecute")
	f.Add("example.com/a", "", "PreferNoSchedule", "example.com/a", "", "NoSchedule")
	f.Fuzz(func(t *testing.T, k1, val1, e1, k2, val2, e2 string) {
		in := []kubelet.Taint{{Key: k1, Value: val1, Effect: e1}, {Key: k2, Value: val2, Effect: e2}}
		problems := kubelet.ValidateConfigTaints(in)
		ourExit := map[string]bool{}
		ourRejected := false
		for _, p := range problems {
			switch p.Effect {
			case kubelet.EffectKubeletExits:
				ourExit[p.Entry] = true
			case kubelet.EffectRegistrationRejected:
				ourRejected = true
			default:
				t.Fatalf("%+v: config problem with effect %v", in, p.Effect)
			}
		}
		var upstream []v1.Taint
		exits := false
		for i, tn := range in {
			ut := v1.Taint{Key: tn.Key, Value: tn.Value, Effect: v1.TaintEffect(tn.Effect)}
			upstream = append(upstream, ut)
			bad := utiltaints.CheckTaintValidation(ut) != nil
			exits = exits || bad
			if bad != ourExit[string(rune('0'+i))] {
				t.Fatalf("entry %d %+v: kubelet config validation fails=%v, check says exits=%v (%+v)", i, tn, bad, ourExit[string(rune('0'+i))], problems)
			}
		}
		if exits {
			return // the kubelet never gets to register the node
		}
		rejected := len(nodeTaintErrors(upstream)) > 0
		if rejected != ourRejected {
			t.Fatalf("%+v: API server rejects=%v (%v), check says rejected=%v (%+v)", in, rejected, nodeTaintErrors(upstream), ourRejected, problems)
		}
	})
}

// nodeTaintErrors returns the errors the API server's Node validation reports for taints.
func nodeTaintErrors(taints []v1.Taint) []string {
	node := &core.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1.ec2.internal"}}
	for _, tn := range taints {
		node.Spec.Taints = append(node.Spec.Taints, core.Taint{Key: tn.Key, Value: tn.Value, Effect: core.TaintEffect(tn.Effect)})
	}
	var out []string
	for _, e := range corevalidation.ValidateNode(node) {
		if strings.Contains(e.Field, "taints") {
			out = append(out, e.Error())
		}
	}
	return out
}
