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
// helm and kustomize are built at a pinned version from the Go module proxy (the only network
// this project assumes) in one build module, buildmod/tools, whose dependency versions are this
// module's wherever both use a module (client-go, apimachinery, protobuf, x/net, ...): the
// packages the project's own static build compiled first are then not compiled again for them
// (docs/benchmarks.md, "CI time"). staticcheck is `go install`ed at its pinned version;
// promtool comes from Debian's prometheus package (`apt-get download`, no install), because
// building it from Go compiles a large part of Prometheus (docs/install.md#alerts-and-dashboard);
// only where apt is missing or fails is it built, without the service discoveries (build tag
// remove_all_sd).
package tools

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"embed"
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

// toolsModule is the build module helm and kustomize are built in (buildmod/tools: it requires
// helm.sh/helm/v3 HelmVersion and sigs.k8s.io/kustomize/kustomize/v5 KustomizeVersion).
const toolsModule = "tools"

var (
	// Helm renders and installs the chart. Its cache directory names the build module's hash,
	// so a helm built from other dependency versions is not taken for this one.
	Helm = Tool{Name: "helm", Version: HelmVersion + BuildModuleKey(toolsModule), Env: "HELM",
		Fetch: GoBuild(toolsModule, "helm.sh/helm/v3/cmd/helm")}
	// Kustomize builds manifests/kustomize.
	Kustomize = Tool{Name: "kustomize", Version: KustomizeVersion + BuildModuleKey(toolsModule), Env: "KUSTOMIZE",
		Fetch: GoBuild(toolsModule, "sigs.k8s.io/kustomize/kustomize/v5")}
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

// cacheBase is the cache directory: $NODEVIGIL_CACHE_DIR, else <user cache dir>/nodevigil.
func cacheBase() (string, error) {
	if base := os.Getenv(CacheDirEnv); base != "" {
		return base, nil
	}
	ucd, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory: set %s: %w", CacheDirEnv, err)
	}
	return filepath.Join(ucd, "nodevigil"), nil
}

// Dir is the tool's cache directory.
func (t Tool) Dir() (string, error) {
	base, err := cacheBase()
	if err != nil {
		return "", err
	}
	sub := t.Name
	if t.Version != "" {
		sub += "-" + t.Version
	}
	return filepath.Join(base, sub), nil
}

// lockFile takes an exclusive flock on path (created if missing), so that test binaries running
// in parallel fetch or build a tool once; unlock releases it.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// fetchLocked returns the cached binary, fetching it first under a file lock in dir.
func (t Tool) fetchLocked(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, t.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
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

// buildModules are the go.mod and go.sum of each build module, embedded as .txt so that they do
// not make a nested module here. Regenerate buildmod/tools (docs/benchmarks.md, "CI time"): in a
// scratch module that imports the two commands, `go get` the pinned helm and kustomize, then `go
// get` this module's version of every module both list where ours is newer and `go mod edit
// -replace` it where ours is older (TestToolsModuleMatchesOurs names each one), `go mod tidy`,
// and copy go.mod and go.sum back.
//
//go:embed buildmod
var buildModules embed.FS

// BuildModuleKey returns "-" and a short hash of a build module's embedded go.mod and go.sum,
// for the names of the cache directories of the tools built in it.
func BuildModuleKey(module string) string {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := buildModules.ReadFile("buildmod/" + module + "/" + f + ".txt")
		if err != nil { // cannot happen: embedded at compile time; GoBuild reports it
			return ""
		}
		h.Write(data)
	}
	return fmt.Sprintf("-%x", h.Sum(nil)[:4])
}

// GoBuild fetches by `go build pkg` in the embedded build module, laid out under the cache
// (<cache>/src/<module><key>), static and with -trimpath like the project's other non-race
// builds. Builds in one module hold its lock one at a time, so that the packages helm and
// kustomize share compile once, not side by side in two go commands.
func GoBuild(module, pkg string) func(ctx context.Context, dst string) error {
	return func(ctx context.Context, dst string) error {
		base, err := cacheBase()
		if err != nil {
			return err
		}
		src := filepath.Join(base, "src", module+BuildModuleKey(module))
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		unlock, err := lockFile(filepath.Join(src, ".lock"))
		if err != nil {
			return err
		}
		defer unlock()
		for _, f := range []string{"go.mod", "go.sum"} {
			data, err := buildModules.ReadFile("buildmod/" + module + "/" + f + ".txt")
			if err != nil {
				return fmt.Errorf("read embedded build module %s: %w", module, err)
			}
			if err := os.WriteFile(filepath.Join(src, f), data, 0o644); err != nil {
				return fmt.Errorf("write build module: %w", err)
			}
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", dst, pkg)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -trimpath", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s (in %s): %w\n%s", strings.Join(cmd.Args, " "), src, err, out)
		}
		return nil
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
// whatever its compression). It reads the archive to its end and waits for dpkg-deb's exit
// status: dpkg-deb writes the whole archive into the pipe, so a reader that stopped at the
// member would leave it blocked on a full pipe, and waiting for it would last until ctx ended
// (with t.Context() in a test, until the test binary's timeout; in CI, 20 minutes).
func extractFromDeb(ctx context.Context, deb, member, dst string) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb: %w", err)
	}
	found, xerr := extractMember(tar.NewReader(out), member, dst)
	if xerr != nil {
		_ = cmd.Process.Kill() // nothing more is read: do not wait for it to fill the pipe
	} else {
		// The rest of the archive: read, so that dpkg-deb can finish writing and exit.
		if _, err := io.Copy(io.Discard, out); err != nil {
			xerr = fmt.Errorf("read %s: %w", deb, err)
		}
	}
	if werr := cmd.Wait(); werr != nil && xerr == nil {
		xerr = fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, werr)
	}
	if xerr == nil && !found {
		xerr = fmt.Errorf("%s has no %s", deb, member)
	}
	return xerr
}

// extractMember copies member from tr to dst; found is false when the archive ends without it.
func extractMember(tr *tar.Reader, member, dst string) (found bool, err error) {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read archive: %w", err)
		}
		if h.Name != member {
			continue
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
		if err != nil {
			return true, err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return true, fmt.Errorf("extract %s: %w", member, err)
		}
		return true, f.Close()
	}
}
