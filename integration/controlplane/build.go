package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Pinned versions of the control-plane components. They move together with the k8s.io
// libraries in go.mod, so that the API the tests exercise is the one the code compiles against.
const (
	// EtcdVersion is the etcd release the harness builds when none is found.
	EtcdVersion = "v3.5.21"
	// KubernetesVersion is the kube-apiserver and kube-controller-manager release.
	KubernetesVersion = "v1.34.2"
)

// Environment variables that point the harness at binaries already on disk. The project's own
// variable wins; KUBEBUILDER_ASSETS is honoured because envtest users already have it set.
const (
	// AssetsEnv names a directory holding etcd, kube-apiserver and kube-controller-manager.
	AssetsEnv = "NODEVIGIL_CONTROL_PLANE_ASSETS"
	// KubebuilderAssetsEnv is envtest's variable (its assets lack kube-controller-manager; the
	// harness then builds only that one).
	KubebuilderAssetsEnv = "KUBEBUILDER_ASSETS"
	// CacheDirEnv overrides where built binaries are cached.
	CacheDirEnv = "NODEVIGIL_CACHE_DIR"
)

//go:embed buildmod
var buildModules embed.FS

// Binaries are the paths of the three control-plane executables.
type Binaries struct {
	Etcd              string
	APIServer         string
	ControllerManager string
}

// BuildConfig says where to look for and build binaries. The zero value is usable.
type BuildConfig struct {
	// CacheDir holds built binaries, one directory per component and version. Defaults to
	// $NODEVIGIL_CACHE_DIR, else <user cache dir>/nodevigil/control-plane.
	CacheDir string
	// Progress receives human-readable progress lines; defaults to os.Stderr, because a cold
	// build takes minutes and a silent test run looks hung.
	Progress io.Writer
	// GoBin is the go command; defaults to "go" on PATH.
	GoBin string
}

func (c *BuildConfig) defaults() error {
	if c.Progress == nil {
		c.Progress = os.Stderr
	}
	// The go command's stdout and stderr and the build heartbeat all write progress at once.
	c.Progress = &lockedWriter{w: c.Progress}
	if c.GoBin == "" {
		c.GoBin = "go"
	}
	if c.CacheDir == "" {
		c.CacheDir = os.Getenv(CacheDirEnv)
	}
	if c.CacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return fmt.Errorf("no cache directory: set %s: %w", CacheDirEnv, err)
		}
		c.CacheDir = filepath.Join(base, "nodevigil", "control-plane")
	}
	return nil
}

// component describes how to find and build one binary.
type component struct {
	name        string // executable name
	version     string // pinned version
	versionRE   *regexp.Regexp
	module      string // directory under buildmod/
	pkg         string // package to build
	ldflags     string
	cacheSubdir string // version and buildModuleKey: new inputs, new directory
}

// buildModuleKey returns "-" and a short hash of a build module's embedded go.mod and go.sum,
// for the cache directory's name. The dependency versions there are chosen to match this
// module's (docs/benchmarks.md, "CI time"), so they change without the component's version
// changing; a cache built from other versions is then not mistaken for this one.
func buildModuleKey(module string) string {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := buildModules.ReadFile("buildmod/" + module + "/" + f + ".txt")
		if err != nil { // cannot happen: embedded at compile time; writeBuildModule reports it
			return ""
		}
		h.Write(data)
	}
	return fmt.Sprintf("-%x", h.Sum(nil)[:4])
}

var (
	etcdComponent = component{
		name: "etcd", version: EtcdVersion, module: "etcd",
		versionRE:   regexp.MustCompile(`etcd Version: 3\.5\.`),
		pkg:         "go.etcd.io/etcd/server/v3",
		cacheSubdir: "etcd-" + EtcdVersion + buildModuleKey("etcd"),
	}
	k8sLDFlags = "-s -w -X k8s.io/component-base/version.gitVersion=" + KubernetesVersion +
		" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34"
	apiServerComponent = component{
		name: "kube-apiserver", version: KubernetesVersion, module: "kubernetes",
		versionRE:   regexp.MustCompile(`Kubernetes v1\.34\.`),
		pkg:         "k8s.io/kubernetes/cmd/kube-apiserver",
		ldflags:     k8sLDFlags,
		cacheSubdir: "kubernetes-" + KubernetesVersion + buildModuleKey("kubernetes"),
	}
	controllerManagerComponent = component{
		name: "kube-controller-manager", version: KubernetesVersion, module: "kubernetes",
		versionRE:   regexp.MustCompile(`Kubernetes v1\.34\.`),
		pkg:         "k8s.io/kubernetes/cmd/kube-controller-manager",
		ldflags:     k8sLDFlags,
		cacheSubdir: "kubernetes-" + KubernetesVersion + buildModuleKey("kubernetes"),
	}
)

// FindOrBuild returns the control-plane binaries: from $NODEVIGIL_CONTROL_PLANE_ASSETS or
// $KUBEBUILDER_ASSETS when they hold the right versions, else from the cache, else built from
// the Go module proxy at the pinned versions. Only what is missing is built, with one `go build`
// per throw-away module: kube-apiserver and kube-controller-manager share most of their packages,
// so building them in one invocation loads the package graph once and links both in parallel.
// Concurrent callers (parallel test packages) serialise on a lock file, and binaries are built
// to a temporary name and renamed into place, so an interrupted build never leaves a broken
// binary in the cache.
func FindOrBuild(ctx context.Context, cfg BuildConfig) (Binaries, error) {
	if err := cfg.defaults(); err != nil {
		return Binaries{}, err
	}
	var out Binaries
	wanted := []struct {
		comp component
		dst  *string
	}{
		{etcdComponent, &out.Etcd},
		{apiServerComponent, &out.APIServer},
		{controllerManagerComponent, &out.ControllerManager},
	}
	missing := map[string][]component{} // build module → components to build from it
	var modules []string
	for _, w := range wanted {
		if p, ok := findExisting(ctx, cfg, w.comp); ok {
			*w.dst = p
			continue
		}
		if missing[w.comp.module] == nil {
			modules = append(modules, w.comp.module)
		}
		missing[w.comp.module] = append(missing[w.comp.module], w.comp)
	}
	for _, m := range modules {
		if err := buildCached(ctx, cfg, missing[m]); err != nil {
			return Binaries{}, err
		}
	}
	for _, w := range wanted {
		if *w.dst == "" {
			*w.dst = cachedPath(cfg, w.comp)
		}
	}
	return out, nil
}

// findExisting looks for a component in the asset directories, then in the cache.
func findExisting(ctx context.Context, cfg BuildConfig, c component) (string, bool) {
	for _, env := range []string{AssetsEnv, KubebuilderAssetsEnv} {
		dir := os.Getenv(env)
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, c.name)
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if ok, got := hasVersion(ctx, p, c.versionRE); ok {
			return p, true
		} else {
			fmt.Fprintf(cfg.Progress, "controlplane: ignoring %s from $%s: version %q does not match %s\n", p, env, got, c.version)
		}
	}
	if bin := cachedPath(cfg, c); isExecutable(bin) {
		return bin, true
	}
	return "", false
}

func cachedPath(cfg BuildConfig, c component) string {
	return filepath.Join(cfg.CacheDir, c.cacheSubdir, c.name)
}

// buildCached builds comps (all from one build module, with the same ldflags) into the cache
// under the build lock, skipping those another process built while this one waited.
func buildCached(ctx context.Context, cfg BuildConfig, comps []component) error {
	if err := os.MkdirAll(cfg.CacheDir, 0o755); err != nil {
		return fmt.Errorf("create cache dir: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(cfg.CacheDir, ".build.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	var todo []component
	for _, c := range comps {
		if !isExecutable(cachedPath(cfg, c)) {
			todo = append(todo, c)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	return build(ctx, cfg, todo)
}

// build runs one `go build` for comps in their throw-away module and renames each binary into
// the cache only once all of them built.
func build(ctx context.Context, cfg BuildConfig, comps []component) error {
	first := comps[0]
	names := make([]string, len(comps))
	pkgs := make([]string, len(comps))
	for i, c := range comps {
		names[i], pkgs[i] = c.name, c.pkg
	}
	what := strings.Join(names, " and ")
	src := filepath.Join(cfg.CacheDir, "src", first.cacheSubdir)
	if err := writeBuildModule(first.module, src); err != nil {
		return err
	}
	dir := filepath.Join(cfg.CacheDir, first.cacheSubdir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cache dir: %w", err)
	}
	fmt.Fprintf(cfg.Progress, "controlplane: building %s %s from the Go module proxy (cold builds take minutes; cached in %s)\n", what, first.version, dir)
	start := time.Now()
	// One package builds to a file; several build into a directory, each binary named after
	// its package (kube-apiserver, kube-controller-manager).
	tmp := filepath.Join(dir, fmt.Sprintf(".tmp-%d", os.Getpid()))
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, first.name)
	if len(comps) > 1 {
		out = tmp + string(filepath.Separator)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return fmt.Errorf("create build dir: %w", err)
	}
	args := []string{"build", "-o", out}
	if first.ldflags != "" {
		args = append(args, "-ldflags", first.ldflags)
	}
	args = append(args, pkgs...)
	cmd := exec.CommandContext(ctx, cfg.GoBin, args...)
	cmd.Dir = src
	// Static and -trimpath, the flavour of every other non-race build here (the images, the
	// binaries the tests run, `make control-plane` itself): the standard library and the
	// dependencies at the same versions then compile once for all of them, not once per
	// flavour (docs/benchmarks.md, "Where the cold time goes").
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -trimpath", "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stdout = cfg.Progress
	cmd.Stderr = io.MultiWriter(&stderr, cfg.Progress)
	done := make(chan struct{})
	go func() { // a heartbeat, so a five-minute build does not look like a hang
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(cfg.Progress, "controlplane: still building %s (%s)\n", what, time.Since(start).Round(time.Second))
			}
		}
	}()
	err := cmd.Run()
	close(done)
	if err != nil {
		return fmt.Errorf("build %s %s: %w: %s", what, first.version, err, tail(stderr.String(), 20))
	}
	for _, c := range comps {
		if !isExecutable(filepath.Join(tmp, c.name)) {
			return fmt.Errorf("build %s %s: go build wrote no %s", what, first.version, c.name)
		}
	}
	for _, c := range comps {
		if err := os.Rename(filepath.Join(tmp, c.name), cachedPath(cfg, c)); err != nil {
			return fmt.Errorf("install %s into cache: %w", c.name, err)
		}
	}
	fmt.Fprintf(cfg.Progress, "controlplane: built %s in %s\n", what, time.Since(start).Round(time.Second))
	return nil
}

// writeBuildModule lays out the throw-away module that pins a component's dependencies. The
// go.mod/go.sum are embedded (as .txt, so they do not make a nested module here) so builds are
// reproducible without a `go mod tidy` against the network.
func writeBuildModule(module, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create build module dir: %w", err)
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := buildModules.ReadFile("buildmod/" + module + "/" + f + ".txt")
		if err != nil {
			return fmt.Errorf("read embedded %s/%s: %w", module, f, err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			return fmt.Errorf("write build module: %w", err)
		}
	}
	return nil
}

func hasVersion(ctx context.Context, bin string, re *regexp.Regexp) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	first := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	if err != nil {
		return false, first
	}
	return re.Match(out), first
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// lockFile takes an exclusive flock, polling so that ctx cancellation is honoured.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open build lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for build lock: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// lockedWriter serialises writes to a writer that is not safe for concurrent use.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
