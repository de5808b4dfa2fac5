package install_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const iamPolicyRelPath = "../../manifests/iam-policy.json"

// iamStatement is the part of an IAM policy statement manifests/iam-policy.json uses.
type iamStatement struct {
	Sid       string
	Effect    string
	Action    any // string or list
	Resource  any // string or list
	Condition map[string]map[string]any
}

// allows evaluates the statements for one action on one instance ARN with its tags: the subset
// of IAM's rules the policy relies on (Allow only, wildcards in Resource, StringEquals on
// aws:ResourceTag/<key> with one value or a list).
func allows(stmts []iamStatement, action, arn string, tags map[string]string) bool {
	for _, s := range stmts {
		if s.Effect != "Allow" || !slices.Contains(strs(s.Action), action) {
			continue
		}
		matched := false
		for _, r := range strs(s.Resource) {
			re := "^" + strings.ReplaceAll(regexp.QuoteMeta(r), `\*`, ".*") + "$"
			if regexp.MustCompile(re).MatchString(arn) {
				matched = true
			}
		}
		if !matched {
			continue
		}
		ok := true
		for op, conds := range s.Condition {
			if op != "StringEquals" {
				return false // an operator this evaluator does not know: refuse rather than guess
			}
			for k, v := range conds {
				key, found := strings.CutPrefix(k, "aws:ResourceTag/")
				if !found {
					return false
				}
				got, has := tags[key]
				if !has || !slices.Contains(strs(v), got) {
					ok = false
				}
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func strs(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// TestIAMPolicy fills in manifests/iam-policy.json's placeholders as docs/install.md says
// (sed, Terraform's templatefile or CloudFormation's Fn::Sub all substitute text) from the
// ownership tag the chart gives the remediator, for the default cluster tag and for an opt-in
// tag, and checks that the policy lets exactly the instances the remediator would terminate be
// terminated: tagged with the remediator's --cluster-tag-key and an accepted value, in the
// right partition; DescribeInstances everywhere (it has no resource-level permissions).
func TestIAMPolicy(t *testing.T) {
	raw, err := os.ReadFile(filepath.FromSlash(iamPolicyRelPath))
	if err != nil {
		t.Fatal(err)
	}
	placeholders := map[string]bool{}
	for _, m := range regexp.MustCompile(`\$\{([^}]*)\}`).FindAllStringSubmatch(string(raw), -1) {
		placeholders[m[1]] = true
	}
	for _, want := range []string{"Partition", "TagKey", "TagValue"} {
		if !placeholders[want] {
			t.Errorf("iam-policy.json has no ${%s} placeholder", want)
		}
		delete(placeholders, want)
	}
	if len(placeholders) > 0 {
		t.Errorf("iam-policy.json has placeholders docs/install.md does not name: %v", placeholders)
	}

	const id = "i-0123456789abcdef0"
	for _, tc := range []struct {
		name      string
		sets      []string // chart values (--set-string, so that "true" stays a string)
		partition string
		tagValue  string              // what the user fills in for ${TagValue}
		allowed   []map[string]string // instance tags TerminateInstances must allow
		denied    []map[string]string // and must refuse
	}{
		{
			name: "cluster tag (default)", sets: []string{"remediator.clusterName=prod"}, partition: "aws", tagValue: "owned",
			allowed: []map[string]string{{"kubernetes.io/cluster/prod": "owned"}},
			denied: []map[string]string{{}, {"kubernetes.io/cluster/other": "owned"}, {"kubernetes.io/cluster/prod": "no"},
				{"nodevigil.io/remediate": "true"}},
		},
		{
			name: "opt-in tag", partition: "aws-us-gov", tagValue: "true",
			sets:    []string{"remediator.clusterName=prod", "remediator.ownershipTag.key=nodevigil.io/remediate", "remediator.ownershipTag.values={true}"},
			allowed: []map[string]string{{"nodevigil.io/remediate": "true"}, {"nodevigil.io/remediate": "true", "kubernetes.io/cluster/prod": "owned"}},
			denied:  []map[string]string{{"kubernetes.io/cluster/prod": "owned"}, {"nodevigil.io/remediate": "false"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", "nodevigil", chartRelPath, "--namespace", namespace, "--kube-version", "1.31.0"}
			for _, s := range tc.sets {
				args = append(args, "--set-string", s)
			}
			out, err := helm(t, args...)
			if err != nil {
				t.Fatalf("helm %v: %v\n%s", args, err, out)
			}
			objs, err := decodeManifest([]byte(out), "helm template")
			if err != nil {
				t.Fatal(err)
			}
			d := findObject(t, objs, "Deployment")
			containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
			args, _, _ = unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
			var key string
			values := []string{"owned", "shared"} // the remediator's default --cluster-tag-values
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--cluster-tag-key="); ok {
					key = v
				}
				if v, ok := strings.CutPrefix(a, "--cluster-tag-values="); ok {
					values = strings.Split(v, ",")
				}
			}
			if key == "" {
				t.Fatalf("remediator args %v have no --cluster-tag-key", args)
			}
			if !slices.Contains(values, tc.tagValue) {
				t.Fatalf("the policy's tag value %q is not one the remediator accepts (%v): the two sides would disagree", tc.tagValue, values)
			}
			filled := strings.NewReplacer("${Partition}", tc.partition, "${TagKey}", key, "${TagValue}", tc.tagValue).Replace(string(raw))
			var pol struct {
				Version   string
				Statement []iamStatement
			}
			if err := json.Unmarshal([]byte(filled), &pol); err != nil {
				t.Fatalf("filled-in policy is not JSON: %v\n%s", err, filled)
			}
			if pol.Version != "2012-10-17" {
				t.Errorf("policy Version %q, want 2012-10-17 (the only one with policy variables)", pol.Version)
			}
			var actions []string
			for _, s := range pol.Statement {
				actions = append(actions, strs(s.Action)...)
			}
			slices.Sort(actions)
			if !slices.Equal(actions, []string{"ec2:DescribeInstances", "ec2:TerminateInstances"}) {
				t.Errorf("policy allows %v, want exactly DescribeInstances and TerminateInstances", actions)
			}
			arn := "arn:" + tc.partition + ":ec2:us-east-1:123456789012:instance/" + id
			if !allows(pol.Statement, "ec2:DescribeInstances", "*", nil) {
				t.Error("DescribeInstances is not allowed on *")
			}
			for _, tags := range tc.allowed {
				if !allows(pol.Statement, "ec2:TerminateInstances", arn, tags) {
					t.Errorf("TerminateInstances refused on an instance tagged %v; the remediator (--cluster-tag-key=%s) would terminate it", tags, key)
				}
			}
			for _, tags := range tc.denied {
				if allows(pol.Statement, "ec2:TerminateInstances", arn, tags) {
					t.Errorf("TerminateInstances allowed on an instance tagged %v; the remediator (--cluster-tag-key=%s) would refuse it", tags, key)
				}
			}
			other := "arn:aws-cn:ec2:cn-north-1:123456789012:instance/" + id
			if allows(pol.Statement, "ec2:TerminateInstances", other, tc.allowed[0]) {
				t.Errorf("TerminateInstances allowed in another partition (%s)", other)
			}
		})
	}
}
