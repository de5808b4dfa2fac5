package tools

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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
