package install_test

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"testing"

	"github.com/nodevigil/nodevigil/integration/tools"
)

// kustomizeBinary returns the pinned kustomize (integration/tools: $KUSTOMIZE, else the
// project's cache, else `go install`ed into it once).
func kustomizeBinary(t *testing.T) string {
	t.Helper()
	p, err := tools.Kustomize.Path(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKustomizeBase builds manifests/kustomize (what `kubectl apply -k` does first) and checks
// it yields exactly install.yaml's objects in install.yaml's order (admission policies before
// the DaemonSet), so the base and the manifest cannot drift (manifests/verify.sh also checks
// that the base's copy is freshly rendered), then applies the built objects to the real
// apiserver as a server-side dry run.
func TestKustomizeBase(t *testing.T) {
	bin := kustomizeBinary(t)
	out, err := exec.CommandContext(t.Context(), bin, "build", filepath.FromSlash("../../manifests/kustomize")).Output()
	if err != nil {
		t.Fatalf("kustomize build manifests/kustomize: %v", err)
	}
	built, err := decodeManifest(out, "kustomize build")
	if err != nil {
		t.Fatal(err)
	}
	want := manifestObjects(t)
	if len(built) != len(want) {
		t.Fatalf("kustomize build gave %d objects, install.yaml has %d", len(built), len(want))
	}
	for i := range want {
		if describe(built[i]) != describe(want[i]) {
			t.Errorf("object %d: kustomize build gave %s, install.yaml has %s", i, describe(built[i]), describe(want[i]))
			continue
		}
		// kustomize's YAML writer re-wraps long multi-line strings (the policies' CEL) with
		// extra line breaks; CEL ignores whitespace, so compare with whitespace runs collapsed.
		if !reflect.DeepEqual(squash(built[i].Object), squash(want[i].Object)) {
			t.Errorf("%s differs between kustomize build and install.yaml", describe(want[i]))
		}
	}
}

var spaces = regexp.MustCompile(`\s+`)

// squash returns v with every run of whitespace in its strings replaced by one space.
func squash(v any) any {
	switch v := v.(type) {
	case string:
		return spaces.ReplaceAllString(v, " ")
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = squash(x)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, x := range v {
			s[i] = squash(x)
		}
		return s
	}
	return v
}
