package tools

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTool is a Tool whose fetch writes a shell script and counts its calls: the seam is the
// fetch function, everything else (env, PATH, cache directory, lock, rename) is real.
func fakeTool(t *testing.T, name string, calls *atomic.Int32, fail error) Tool {
	t.Helper()
	return Tool{Name: name, Version: "v1.2.3", Env: "NODEVIGIL_FAKE_" + strings.ToUpper(name),
		Fetch: func(ctx context.Context, dst string) error {
			calls.Add(1)
			if fail != nil {
				return fail
			}
			return os.WriteFile(dst, []byte("#!/bin/sh\necho "+name+"\n"), 0o755)
		}}
}

func TestPath(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       bool   // the tool's variable names a binary
		onPATH    bool   // a binary of the name is on PATH
		fromPATH  bool   // the tool accepts one on PATH
		cached    bool   // the cache already holds it
		fail      error  // fetch fails
		wantFrom  string // "env", "path", "cache"
		wantCalls int32
		wantErr   string
	}{
		{name: "env wins over everything", env: true, onPATH: true, fromPATH: true, cached: true, wantFrom: "env"},
		{name: "PATH when the version does not matter", onPATH: true, fromPATH: true, wantFrom: "path"},
		{name: "PATH ignored for a pinned tool", onPATH: true, wantFrom: "cache", wantCalls: 1},
		{name: "cached: no fetch", cached: true, wantFrom: "cache"},
		{name: "missing: fetched once", wantFrom: "cache", wantCalls: 1},
		{name: "fetch fails: error names the tool and its variable", fail: errors.New("no network"), wantCalls: 1,
			wantErr: "faketool: no network (or set NODEVIGIL_FAKE_FAKETOOL to a faketool binary)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache, bin := t.TempDir(), t.TempDir()
			t.Setenv(CacheDirEnv, cache)
			t.Setenv("PATH", bin)
			var calls atomic.Int32
			tool := fakeTool(t, "faketool", &calls, tc.fail)
			tool.FromPATH = tc.fromPATH
			envBin := filepath.Join(t.TempDir(), "from-env")
			if tc.env {
				t.Setenv(tool.Env, envBin)
			} else {
				t.Setenv(tool.Env, "")
			}
			if tc.onPATH {
				if err := os.WriteFile(filepath.Join(bin, tool.Name), []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			dir, err := tool.Dir()
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(cache, "faketool-v1.2.3"); dir != want {
				t.Fatalf("Dir() = %s, want %s", dir, want)
			}
			if tc.cached {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, tool.Name), []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			got, err := tool.Path(t.Context())
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Path() error %v, want %q", err, tc.wantErr)
				}
				if _, serr := os.Stat(filepath.Join(dir, tool.Name+".tmp")); !os.IsNotExist(serr) {
					t.Errorf("a failed fetch left %s.tmp behind (%v)", tool.Name, serr)
				}
			} else if err != nil {
				t.Fatalf("Path(): %v", err)
			}
			want := map[string]string{"env": envBin, "path": filepath.Join(bin, tool.Name), "cache": filepath.Join(dir, tool.Name), "": ""}[tc.wantFrom]
			if got != want {
				t.Errorf("Path() = %q, want %q (%s)", got, want, tc.wantFrom)
			}
			if calls.Load() != tc.wantCalls {
				t.Errorf("fetched %d times, want %d", calls.Load(), tc.wantCalls)
			}
		})
	}
}

// TestPathFetchesOnceUnderConcurrency: many goroutines (as parallel tests do) and a second
// "process" (a fresh per-process memo, same cache) ask at once; the tool is fetched once.
func TestPathFetchesOnceUnderConcurrency(t *testing.T) {
	t.Setenv(CacheDirEnv, t.TempDir())
	var calls atomic.Int32
	tool := fakeTool(t, "concurrent", &calls, nil)
	var wg sync.WaitGroup
	paths := make([]string, 8)
	errs := make([]error, 8)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 1 {
				// The file lock, not the in-process memo, must hold here.
				p, err := tool.fetchLocked(context.Background(), mustDir(t, tool))
				paths[i], errs[i] = p, err
				return
			}
			paths[i], errs[i] = tool.Path(context.Background())
		}()
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Errorf("caller %d: %q, %v; want %q", i, paths[i], errs[i], paths[0])
		}
	}
	if calls.Load() != 1 {
		t.Errorf("fetched %d times, want once", calls.Load())
	}
}

func mustDir(t *testing.T, tool Tool) string {
	t.Helper()
	d, err := tool.Dir()
	if err != nil {
		t.Error(err)
	}
	return d
}

func TestBinaryName(t *testing.T) {
	for pkg, want := range map[string]string{
		"helm.sh/helm/v3/cmd/helm":           "helm",
		"sigs.k8s.io/kustomize/kustomize/v5": "kustomize",
		"example.com/tool/v":                 "v",
		"example.com/vet":                    "vet",
	} {
		if got := binaryName(pkg); got != want {
			t.Errorf("binaryName(%q) = %q, want %q", pkg, got, want)
		}
	}
}

func TestFirstOf(t *testing.T) {
	write := func(name string, calls *[]string) func(context.Context, string) error {
		return func(_ context.Context, dst string) error {
			*calls = append(*calls, name)
			return os.WriteFile(dst, []byte("#!/bin/sh\necho "+name+"\n"), 0o755)
		}
	}
	fail := func(name string, calls *[]string) func(context.Context, string) error {
		return func(_ context.Context, dst string) error {
			*calls = append(*calls, name)
			_ = os.WriteFile(dst, []byte("half"), 0o644) // a failed way may leave a partial file
			return errors.New(name + " failed")
		}
	}
	for _, tc := range []struct {
		name      string
		ways      []string // "ok:x" or "fail:x"
		wantCalls string
		wantFrom  string // the way whose file dst holds; "" when all failed
		wantErr   string
	}{
		{name: "first works: the second is not tried", ways: []string{"ok:apt", "ok:build"}, wantCalls: "apt", wantFrom: "apt"},
		{name: "first fails: the second's file", ways: []string{"fail:apt", "ok:build"}, wantCalls: "apt,build", wantFrom: "build"},
		{name: "all fail: every error named, nothing left", ways: []string{"fail:apt", "fail:build"}, wantCalls: "apt,build",
			wantErr: "apt failed\nbuild failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []string
			var ways []func(context.Context, string) error
			for _, w := range tc.ways {
				kind, name, _ := strings.Cut(w, ":")
				if kind == "ok" {
					ways = append(ways, write(name, &calls))
				} else {
					ways = append(ways, fail(name, &calls))
				}
			}
			dst := filepath.Join(t.TempDir(), "tool")
			err := FirstOf(ways...)(t.Context(), dst)
			if got := strings.Join(calls, ","); got != tc.wantCalls {
				t.Errorf("tried %s, want %s", got, tc.wantCalls)
			}
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				if _, serr := os.Stat(dst); !os.IsNotExist(serr) {
					t.Errorf("a failed fetch left %s behind (%v)", dst, serr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(dst)
			if err != nil || !strings.Contains(string(b), "echo "+tc.wantFrom) {
				t.Errorf("dst holds %q (%v), want the file of %s", b, err, tc.wantFrom)
			}
		})
	}
}

// TestPromtoolWithoutApt: where apt-get fails (or is missing), promtool is built from the pinned
// Prometheus module without its service discoveries. The seam is the executables: stand-ins
// for apt-get and go on PATH record how they were called; Promtool.Path is the real finder.
func TestPromtoolWithoutApt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		apt     string // the stand-in apt-get's script body; "" for none on PATH
		wantApt bool
	}{
		{name: "apt-get fails", apt: "echo \"E: no network\" >&2; exit 100", wantApt: true},
		{name: "no apt-get", apt: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chmod, err := exec.LookPath("chmod")
			if err != nil {
				t.Fatal(err)
			}
			bin, cache := t.TempDir(), t.TempDir()
			record := filepath.Join(t.TempDir(), "calls")
			stub := func(name, body string) {
				script := "#!/bin/sh\necho \"" + name + " $*\" >>" + record + "\n" + body + "\n"
				if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tc.apt != "" {
				stub("apt-get", tc.apt)
			}
			stub("go", `printf '#!/bin/sh\necho built promtool\n' >"$GOBIN/promtool" && `+chmod+` +x "$GOBIN/promtool" && echo "env $GOFLAGS $CGO_ENABLED" >>`+record)
			t.Setenv("PATH", bin)
			t.Setenv("PROMTOOL", "")
			t.Setenv(CacheDirEnv, cache)
			p, err := Promtool.Path(t.Context())
			if err != nil {
				t.Fatalf("Path(): %v", err)
			}
			if want := filepath.Join(cache, "promtool", "promtool"); p != want {
				t.Errorf("Path() = %s, want %s", p, want)
			}
			b, err := os.ReadFile(record)
			if err != nil {
				t.Fatal(err)
			}
			calls := string(b)
			if got := strings.Contains(calls, "apt-get download prometheus"); got != tc.wantApt {
				t.Errorf("apt-get download tried: %v, want %v; calls:\n%s", got, tc.wantApt, calls)
			}
			wantGo := "go install -tags remove_all_sd github.com/prometheus/prometheus/cmd/promtool@" + PromtoolSourceVersion
			if !strings.Contains(calls, wantGo) || !strings.Contains(calls, "env -trimpath 0") {
				t.Errorf("calls:\n%s\nwant %q with GOFLAGS=-trimpath CGO_ENABLED=0", calls, wantGo)
			}
		})
	}
}

// TestDebianPackageExtract runs DebianPackage's real path (apt-get download, dpkg-deb) on a
// package built here and served by a stand-in apt-get: the member comes first in the archive
// and is followed by far more than a pipe holds, as promtool is in Debian's prometheus
// package. Extraction must return as soon as the archive is read, not when ctx ends (it used
// to wait for dpkg-deb, blocked on the unread rest, until the deadline: 20 minutes in CI).
func TestDebianPackageExtract(t *testing.T) {
	dpkgDeb, err := exec.LookPath("dpkg-deb")
	if err != nil {
		t.Fatalf("this test builds a .deb with dpkg-deb (Debian's dpkg package): %v", err)
	}
	root := filepath.Join(t.TempDir(), "pkg")
	files := map[string]string{
		"DEBIAN/control":     "Package: faketool\nVersion: 1.0\nArchitecture: all\nMaintainer: nodevigil <nodevigil@example.invalid>\nDescription: test package\n",
		"usr/bin/faketool":   "#!/bin/sh\necho faketool\n",
		"usr/share/zz/large": strings.Repeat("0123456789abcdef", 1<<16), // 1 MiB after the member
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	repo := t.TempDir()
	deb := filepath.Join(repo, "faketool_1.0_all.deb")
	if out, err := exec.Command(dpkgDeb, "--root-owner-group", "--build", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	bin := t.TempDir()
	aptGet := "#!/bin/sh\n[ \"$1\" = download ] && cp " + deb + " .\n"
	if err := os.WriteFile(filepath.Join(bin, "apt-get"), []byte(aptGet), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	for _, tc := range []struct {
		name, member, wantErr string
	}{
		{name: "member found", member: "./usr/bin/faketool"},
		{name: "member missing", member: "./usr/bin/other", wantErr: "has no ./usr/bin/other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Generous for a loaded machine; the fixed extraction takes well under a second.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			dst := filepath.Join(t.TempDir(), "faketool")
			err := DebianPackage("faketool", tc.member)(ctx, dst)
			if ctx.Err() != nil {
				t.Fatalf("extraction returned only when its context ended (err %v)", err)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != files["usr/bin/faketool"] {
				t.Errorf("extracted %q, want %q", b, files["usr/bin/faketool"])
			}
		})
	}
}

// modVersions reads the module versions a go.mod selects: its requirements, overridden by its
// replacements (the build module replaces where this module's version is older than helm's).
func modVersions(gomod string) map[string]string {
	v := map[string]string{}
	repl := map[string]string{}
	block := ""
	for _, line := range strings.Split(gomod, "\n") {
		f := strings.Fields(strings.TrimSpace(strings.SplitN(line, "//", 2)[0]))
		switch {
		case len(f) == 0:
		case len(f) == 2 && f[1] == "(":
			block = f[0]
		case f[0] == ")":
			block = ""
		case f[0] == "require" && len(f) == 3:
			v[f[1]] = f[2]
		case block == "require" && len(f) == 2:
			v[f[0]] = f[1]
		case f[0] == "replace" && len(f) == 5 && f[2] == "=>":
			repl[f[1]] = f[4]
		case block == "replace" && len(f) == 4 && f[1] == "=>":
			repl[f[0]] = f[3]
		}
	}
	for m, r := range repl {
		v[m] = r
	}
	return v
}

// drift lists the modules both go.mod files select at different versions.
func drift(ours, build string) []string {
	o, b := modVersions(ours), modVersions(build)
	var out []string
	for m, bv := range b {
		if ov, ok := o[m]; ok && ov != bv {
			out = append(out, m+": build module "+bv+", go.mod "+ov)
		}
	}
	sort.Strings(out)
	return out
}

func TestDrift(t *testing.T) {
	const ours = "module x\n\ngo 1.26\n\nrequire (\n\tk8s.io/client-go v0.34.2\n\tgolang.org/x/time v0.9.0 // indirect\n)\n\nrequire golang.org/x/net v0.59.0\n"
	for _, tc := range []struct {
		name, build string
		want        []string
	}{
		{name: "aligned, one by replacement",
			build: "module t\n\nrequire (\n\thelm.sh/helm/v3 v3.19.0\n\tk8s.io/client-go v0.34.2 // indirect\n\tgolang.org/x/time v0.12.0 // indirect\n\tgolang.org/x/net v0.59.0\n)\n\nreplace golang.org/x/time => golang.org/x/time v0.9.0\n"},
		{name: "a newer helm requirement not replaced",
			build: "module t\n\nrequire (\n\tk8s.io/client-go v0.34.2\n\tgolang.org/x/time v0.12.0\n)\n",
			want:  []string{"golang.org/x/time: build module v0.12.0, go.mod v0.9.0"}},
		{name: "go.mod moved on",
			build: "module t\n\nrequire k8s.io/client-go v0.34.1\n\nreplace (\n\tgolang.org/x/net => golang.org/x/net v0.58.0\n)\n",
			want:  []string{"golang.org/x/net: build module v0.58.0, go.mod v0.59.0", "k8s.io/client-go: build module v0.34.1, go.mod v0.34.2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := drift(ours, tc.build); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("drift() = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestToolsModuleMatchesOurs keeps buildmod/tools on this module's versions: a module both
// use at another version there splits every package above it into two compiles in a cold run
// (helm's client-go would not be the one the project's static build compiled).
func TestToolsModuleMatchesOurs(t *testing.T) {
	ours, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	build, err := buildModules.ReadFile("buildmod/" + toolsModule + "/go.mod.txt")
	if err != nil {
		t.Fatal(err)
	}
	if d := drift(string(ours), string(build)); len(d) > 0 {
		t.Errorf("buildmod/tools/go.mod.txt selects other versions than go.mod (regenerate it as tools.go says):\n%s", strings.Join(d, "\n"))
	}
	for _, want := range []string{"helm.sh/helm/v3 " + HelmVersion, "sigs.k8s.io/kustomize/kustomize/v5 " + KustomizeVersion} {
		if !strings.Contains(string(build), want) {
			t.Errorf("buildmod/tools/go.mod.txt does not require %s", want)
		}
	}
}
