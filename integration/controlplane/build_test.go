package controlplane

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeBinary writes an executable script that prints version when called with --version.
func fakeBinary(t *testing.T, dir, name, version string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho '"+version+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFindOrBuildPrefersMatchingAssets(t *testing.T) {
	cache := t.TempDir()
	// Cached binaries exist for every component, so nothing is ever built in this test.
	cached := map[string]string{}
	for _, c := range []component{etcdComponent, apiServerComponent, controllerManagerComponent} {
		cached[c.name] = fakeBinary(t, filepath.Join(cache, c.cacheSubdir), c.name, "cached")
	}
	tests := []struct {
		name     string
		env      string
		assets   map[string]string // binary name → version it reports
		want     map[string]string // binary name → "assets" or "cache"
		ignoring string            // expected in the progress output
	}{
		{
			name:   "envtest assets without a controller manager",
			env:    KubebuilderAssetsEnv,
			assets: map[string]string{"etcd": "etcd Version: 3.5.17", "kube-apiserver": "Kubernetes v1.34.0"},
			want:   map[string]string{"etcd": "assets", "kube-apiserver": "assets", "kube-controller-manager": "cache"},
		},
		{
			name:     "wrong versions are ignored",
			env:      AssetsEnv,
			assets:   map[string]string{"etcd": "etcd Version: 3.4.0", "kube-apiserver": "Kubernetes v1.29.3", "kube-controller-manager": "Kubernetes v1.34.2"},
			want:     map[string]string{"etcd": "cache", "kube-apiserver": "cache", "kube-controller-manager": "assets"},
			ignoring: "does not match",
		},
		{
			name: "no assets",
			want: map[string]string{"etcd": "cache", "kube-apiserver": "cache", "kube-controller-manager": "cache"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(AssetsEnv, "")
			t.Setenv(KubebuilderAssetsEnv, "")
			assets := t.TempDir()
			for name, version := range tt.assets {
				fakeBinary(t, assets, name, version)
			}
			if tt.env != "" {
				t.Setenv(tt.env, assets)
			}
			var progress bytes.Buffer
			bins, err := FindOrBuild(context.Background(), BuildConfig{CacheDir: cache, Progress: &progress, GoBin: "/nonexistent/go"})
			if err != nil {
				t.Fatalf("FindOrBuild: %v", err)
			}
			got := map[string]string{"etcd": bins.Etcd, "kube-apiserver": bins.APIServer, "kube-controller-manager": bins.ControllerManager}
			for name, where := range tt.want {
				want := cached[name]
				if where == "assets" {
					want = filepath.Join(assets, name)
				}
				if got[name] != want {
					t.Errorf("%s = %s, want %s (%s)", name, got[name], want, where)
				}
			}
			if tt.ignoring != "" && !strings.Contains(progress.String(), tt.ignoring) {
				t.Errorf("progress should say why assets were ignored, got %q", progress.String())
			}
		})
	}
}

func TestBuildFailureLeavesNoBinaryInCache(t *testing.T) {
	cache := t.TempDir()
	// A "go" that fails half-way, after writing a partial output file, as an interrupted build would.
	goBin := filepath.Join(t.TempDir(), "go")
	script := "#!/bin/sh\nwhile [ \"$1\" != \"-o\" ]; do shift; done\necho partial > \"$2\"\necho 'compile: out of memory' >&2\nexit 1\n"
	if err := os.WriteFile(goBin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(AssetsEnv, "")
	t.Setenv(KubebuilderAssetsEnv, "")
	_, err := FindOrBuild(context.Background(), BuildConfig{CacheDir: cache, Progress: &bytes.Buffer{}, GoBin: goBin})
	if err == nil || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("want the build's error with its stderr, got %v", err)
	}
	if isExecutable(filepath.Join(cache, etcdComponent.cacheSubdir, "etcd")) {
		t.Fatal("a failed build left a binary in the cache")
	}
	leftovers, _ := filepath.Glob(filepath.Join(cache, etcdComponent.cacheSubdir, ".tmp-*"))
	if len(leftovers) != 0 {
		t.Fatalf("temporary build output left behind: %v", leftovers)
	}
}

// A cold cache builds kube-apiserver and kube-controller-manager in one go build (their shared
// packages load once and the two links run in parallel) and etcd in another, both static and
// -trimpath (the flavour of the project's other non-race builds, so shared packages compile
// once); a warm one builds nothing.
func TestBuildGroupsComponentsByModule(t *testing.T) {
	cache := t.TempDir()
	calls := filepath.Join(t.TempDir(), "calls")
	// A "go" that logs its arguments and writes, for each package, an executable named after
	// the package's last path element: into the -o directory when it ends in a slash.
	goBin := filepath.Join(t.TempDir(), "go")
	script := `#!/bin/sh
echo "$@ | GOFLAGS=$GOFLAGS CGO_ENABLED=$CGO_ENABLED" >> ` + calls + `
out=""; pkgs=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    -ldflags) shift 2 ;;
    build) shift ;;
    *) pkgs="$pkgs $1"; shift ;;
  esac
done
for p in $pkgs; do
  case "$out" in
    */) f="$out$(basename "$p")" ;;
    *) f="$out" ;;
  esac
  printf '#!/bin/sh\necho built\n' > "$f"; chmod +x "$f"
done
`
	if err := os.WriteFile(goBin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(AssetsEnv, "")
	t.Setenv(KubebuilderAssetsEnv, "")
	cfg := BuildConfig{CacheDir: cache, Progress: &bytes.Buffer{}, GoBin: goBin}
	bins, err := FindOrBuild(context.Background(), cfg)
	if err != nil {
		t.Fatalf("FindOrBuild: %v", err)
	}
	for _, p := range []string{bins.Etcd, bins.APIServer, bins.ControllerManager} {
		if !isExecutable(p) || !strings.HasPrefix(p, cache) {
			t.Errorf("%s is not an executable in the cache", p)
		}
	}
	data, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 go build invocations (etcd; apiserver+controller-manager), got %d:\n%s", len(lines), data)
	}
	if !strings.Contains(lines[1], apiServerComponent.pkg) || !strings.Contains(lines[1], controllerManagerComponent.pkg) {
		t.Errorf("kube-apiserver and kube-controller-manager should build in one invocation, got %q", lines[1])
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, "| GOFLAGS=-mod=mod -trimpath CGO_ENABLED=0") {
			t.Errorf("want a static -trimpath build (GOFLAGS=-mod=mod -trimpath CGO_ENABLED=0), got %q", l)
		}
	}
	if _, err := FindOrBuild(context.Background(), cfg); err != nil {
		t.Fatalf("warm FindOrBuild: %v", err)
	}
	if again, _ := os.ReadFile(calls); len(again) != len(data) {
		t.Errorf("a warm cache must build nothing; go was called again:\n%s", again)
	}
}

// TestCacheDirNamesTheBuildModule: a component's cache directory carries a hash of its build
// module, so that binaries built from other dependency versions are not taken from the cache.
func TestCacheDirNamesTheBuildModule(t *testing.T) {
	for _, c := range []component{etcdComponent, apiServerComponent, controllerManagerComponent, kwokComponent} {
		want := c.module + "-" + c.version + buildModuleKey(c.module)
		if len(buildModuleKey(c.module)) != len("-01234567") || c.cacheSubdir != want {
			t.Errorf("%s: cache directory %q, want %q with an 8-digit build-module hash", c.name, c.cacheSubdir, want)
		}
	}
	if buildModuleKey("etcd") == buildModuleKey("kubernetes") {
		t.Errorf("etcd and kubernetes build modules hash alike: %s", buildModuleKey("etcd"))
	}
}
