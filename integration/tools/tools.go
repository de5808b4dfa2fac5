// Package tools finds the third-party programs the integration tests, the manifest checks and
// the linter run (helm, kustomize, promtool, staticcheck), and fetches a missing one once into the project's cache.
//
// One finder, not one per test file, because every tool follows the same rule and CI wants
// to fetch them all early, in the background, while it lints (`go run ./integration/cmd/tools`):
//
//  1. the environment variable (HELM, KUSTOMIZE, PROMTOOL, STATICCHECK) names a binary: use it;
//  2. for tools whose version does not matter (promtool), one on PATH is used;
//  3. the cache (<cache>/<name>-<version>/<name>, cache = $NODEVIGIL_CACHE_DIR or
//     <user cache dir>/nodevigil) holds one: use it;
//  4. else fetch it under a file lock (so parallel test binaries fetch it once), to a
//     temporary name renamed into place (so an interrupted fetch leaves nothing behind).
//
// helm, kustomize and staticcheck are `go install`ed at a pinned version from the Go module proxy (the
// only network this project assumes); promtool comes from Debian's prometheus package
// (`apt-get download`, no install), because building it from Go compiles a large part of
// Prometheus (docs/install.md#alerts-and-dashboard); only where apt is missing or fails is it
// built, without the service discoveries (build tag remove_all_sd).
package tools

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
)

// CacheDirEnv overrides the cache directory (shared with the control-plane harness).
const CacheDirEnv = "NODEVIGIL_CACHE_DIR"

// Tool is one external program and how to get it.
type Tool struct {
	// Name is the executable's name.
	Name string
	// Version pins what is fetched; "" when any version does (the cache directory is then
	// just Name).
	Version string
	// Env names a variable that, when set, points at a binary to use as is.
	Env string
	// FromPATH accepts a binary of this name on PATH (for tools whose version does not matter).
	FromPATH bool
	// Fetch writes the executable to dst (a temporary name in the cache directory).
	Fetch func(ctx context.Context, dst string) error
}

// The pinned tools. HelmVersion is also manifests/render.sh's.
const (
	HelmVersion      = "v3.19.0"
	KustomizeVersion = "v5.7.1" // kubectl 1.31+ embeds v5.4 or later; sortOptions needs v5.0
	// StaticcheckVersion is the linter `make lint` runs.
	StaticcheckVersion = "v0.8.2"
	// PromtoolSourceVersion is the Prometheus module promtool is built from when Debian's
	// package cannot be had (module v0.316.0 is Prometheus 3.16).
	PromtoolSourceVersion = "v0.316.0"
)

var (
	// Helm renders and installs the chart.
	Helm = Tool{Name: "helm", Version: HelmVersion, Env: "HELM",
		Fetch: GoInstall("helm.sh/helm/v3/cmd/helm", HelmVersion)}
	// Kustomize builds manifests/kustomize.
	Kustomize = Tool{Name: "kustomize", Version: KustomizeVersion, Env: "KUSTOMIZE",
		Fetch: GoInstall("sigs.k8s.io/kustomize/kustomize/v5", KustomizeVersion)}
	// Promtool checks and unit-tests the chart's alerting rules. Debian's package first (a
	// 19 MB download); where apt is missing or fails, built from the Prometheus module without
	// its service discoveries, which promtool's rule checks never use (still minutes of CPU:
	// docs/benchmarks.md).
	Promtool = Tool{Name: "promtool", Env: "PROMTOOL", FromPATH: true,
		Fetch: FirstOf(
			DebianPackage("prometheus", "./usr/bin/promtool"),
			GoInstall("github.com/prometheus/prometheus/cmd/promtool", PromtoolSourceVersion, "remove_all_sd"),
		)}
)

// Staticcheck is `make lint`'s linter. Installed rather than `go run`: `go run` compiled it
// (and the standard library under it) in a flavour nothing else used, cgo on and no -trimpath;
// installed static with -trimpath, it shares the standard library the project's binaries
// compiled. The cache directory names the Go version too, because staticcheck must be built
// by the toolchain whose export data it reads.
var Staticcheck = Tool{Name: "staticcheck", Version: StaticcheckVersion + "-" + runtime.Version(), Env: "STATICCHECK",
	Fetch: GoInstall("honnef.co/go/tools/cmd/staticcheck", StaticcheckVersion)}

// All are the tools `go run ./integration/cmd/tools` fetches by default.
var All = []Tool{Helm, Kustomize, Promtool}

// Known are the tools `go run ./integration/cmd/tools NAME` can find: All and staticcheck.
var Known = append(append([]Tool(nil), All...), Staticcheck)

// entry remembers, per cache directory and process, the path found; its lock keeps two
// goroutines from fetching the same tool while others fetch other tools.
type entry struct {
	mu   sync.Mutex
	path string
}

var (
	mu      sync.Mutex
	entries = map[string]*entry{}
)

// Path returns the tool's executable, fetching it into the cache when it is not found.
func (t Tool) Path(ctx context.Context) (string, error) {
	if t.Env != "" {
		if p := os.Getenv(t.Env); p != "" {
			return p, nil
		}
	}
	if t.FromPATH {
		if p, err := exec.LookPath(t.Name); err == nil {
			return p, nil
		}
	}
	dir, err := t.Dir()
	if err != nil {
		return "", err
	}
	mu.Lock()
	e := entries[dir]
	if e == nil {
		e = &entry{}
		entries[dir] = e
	}
	mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.path != "" {
		return e.path, nil
	}
	p, err := t.fetchLocked(ctx, dir)
	if err != nil {
		return "", fmt.Errorf("%s: %w (or set %s to a %s binary)", t.Name, err, t.Env, t.Name)
	}
	e.path = p
	return p, nil
}

// Dir is the tool's cache directory.
func (t Tool) Dir() (string, error) {
	base := os.Getenv(CacheDirEnv)
	if base == "" {
		ucd, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory: set %s: %w", CacheDirEnv, err)
		}
		base = filepath.Join(ucd, "nodevigil")
	}
	sub := t.Name
	if t.Version != "" {
		sub += "-" + t.Version
	}
	return filepath.Join(base, sub), nil
}

// fetchLocked returns the cached binary, fetching it first under a file lock in dir.
func (t Tool) fetchLocked(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, t.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if isExecutable(bin) {
		return bin, nil
	}
	if t.Fetch == nil {
		return "", fmt.Errorf("not found and no way to fetch it")
	}
	tmp := bin + ".tmp"
	_ = os.Remove(tmp)
	if err := t.Fetch(ctx, tmp); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if !isExecutable(tmp) {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("fetching wrote no executable %s", tmp)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// FirstOf fetches with each way in turn until one succeeds, and names every failure when none
// does (e.g. a Debian package, else a build from source where apt is not available).
func FirstOf(fetches ...func(ctx context.Context, dst string) error) func(ctx context.Context, dst string) error {
	return func(ctx context.Context, dst string) error {
		var errs []error
		for _, f := range fetches {
			err := f(ctx, dst)
			if err == nil {
				return nil
			}
			_ = os.Remove(dst)
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
		return errors.Join(errs...)
	}
}

// GoInstall fetches by `go install pkg@version` (with the build tags given) into a temporary
// GOBIN, run outside any module (so the project's go.mod plays no part), with GOFLAGS set to
// just -trimpath and cgo off.
func GoInstall(pkg, version string, tags ...string) func(ctx context.Context, dst string) error {
	return func(ctx context.Context, dst string) error {
		gobin, err := os.MkdirTemp(filepath.Dir(dst), "gobin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(gobin)
		args := []string{"install"}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, ","))
		}
		cmd := exec.CommandContext(ctx, "go", append(args, pkg+"@"+version)...)
		cmd.Dir = gobin
		// Static and -trimpath like the project's other non-race builds, so that the standard
		// library and shared dependencies compile once (docs/benchmarks.md).
		cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=-trimpath", "GOWORK=off", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out)
		}
		return os.Rename(filepath.Join(gobin, binaryName(pkg)), dst)
	}
}

// binaryName is the executable `go install` writes for pkg: its last path element, or the one
// before a major-version suffix (sigs.k8s.io/kustomize/kustomize/v5 → kustomize).
func binaryName(pkg string) string {
	dir, base := path.Split(pkg)
	if len(base) > 1 && base[0] == 'v' && strings.Trim(base[1:], "0123456789") == "" && dir != "" {
		return path.Base(strings.TrimSuffix(dir, "/"))
	}
	return base
}

// DebianPackage fetches member (e.g. ./usr/bin/promtool) from Debian package pkg with
// `apt-get download` (no install, no service started). A fresh machine may have no package
// lists yet; as root it then runs `apt-get update` once and retries.
func DebianPackage(pkg, member string) func(ctx context.Context, dst string) error {
	return func(ctx context.Context, dst string) error {
		if _, err := exec.LookPath("apt-get"); err != nil {
			return fmt.Errorf("no apt-get to download Debian's %s package: %w", pkg, err)
		}
		tmp, err := os.MkdirTemp(filepath.Dir(dst), "apt-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		download := func() error {
			cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
			cmd.Dir = tmp
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("apt-get download %s: %w\n%s", pkg, err, out)
			}
			return nil
		}
		if err := download(); err != nil {
			if os.Geteuid() != 0 {
				return err
			}
			if out, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
				return fmt.Errorf("%w; apt-get update: %v\n%s", err, uerr, out)
			}
			if err := download(); err != nil {
				return err
			}
		}
		debs, _ := filepath.Glob(filepath.Join(tmp, pkg+"_*.deb"))
		if len(debs) != 1 {
			return fmt.Errorf("apt-get download left %d %s .deb files in %s", len(debs), pkg, tmp)
		}
		return extractFromDeb(ctx, debs[0], member, dst)
	}
}

// extractFromDeb writes one file of a .deb's data archive to dst (dpkg-deb reads the archive,
// whatever its compression).
func extractFromDeb(ctx context.Context, deb, member, dst string) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb: %w", err)
	}
	defer func() { _ = cmd.Wait() }()
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s has no %s", deb, member)
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", deb, err)
		}
		if h.Name != member {
			continue
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return fmt.Errorf("extract %s: %w", member, err)
		}
		return f.Close()
	}
}
