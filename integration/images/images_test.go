// Package images_test builds nodevigil's container images the way `make images` does
// (build/images/imagebuild, both binaries for linux/amd64 and linux/arm64), and checks what the
// images promise: the platforms, a non-root user, the entrypoint, the OCI labels, no shell,
// static binaries of the right architecture, the same digest from a second build, and that the
// images survive a push to and pull from a real OCI registry (go-containerregistry's, in
// process) with a binary that runs and reports the version it was stamped with.
package images_test

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nodevigil/nodevigil/build/images/imagebuild"
)

// The version and commit the test stamps; fixed, so that nothing depends on the checkout's git
// state.
const (
	testVersion = "v9.8.7-imagetest"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
)

// Built once in TestMain: two independent builds of the same inputs, the first also written as
// OCI layouts under layoutDir.
var (
	first, second []imagebuild.Image
	layoutDir     string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "nodevigil-imagetest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	layoutDir = filepath.Join(tmp, "layouts")
	// Cold, the arm64 build compiles the whole dependency graph once more: 16 minutes on a quiet
	// 2-core machine, over 20 on a busy one. The build may use the test binary's whole -timeout
	// but a minute, so that a slow build fails with its own message, not a timeout panic.
	ctx, cancel := context.WithTimeout(context.Background(), buildBudget())
	defer cancel()
	start := time.Now()
	for i, dst := range []*[]imagebuild.Image{&first, &second} {
		work := filepath.Join(tmp, fmt.Sprintf("work%d", i))
		imgs, err := imagebuild.Build(ctx, imagebuild.Options{
			Root: filepath.Join("..", ".."), Version: testVersion, Commit: testCommit, WorkDir: work,
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "build %d: %v\n", i+1, err)
			return 1
		}
		*dst = imgs
	}
	for _, img := range first {
		if err := imagebuild.WriteLayout(filepath.Join(layoutDir, img.Binary.Name), img, testVersion); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Fprintf(os.Stderr, "images: built %d images twice in %s\n", len(first), time.Since(start).Round(time.Second))
	return m.Run()
}

// buildBudget is the time the images' builds may take: the test binary's -timeout less a
// minute for the tests themselves, or 40 minutes without one.
func buildBudget() time.Duration {
	flag.Parse()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > 2*time.Minute {
			return d - time.Minute
		}
	}
	return 40 * time.Minute
}

func digest(t *testing.T, d interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// platformImages returns the index's images by "os/arch", failing on anything but images.
func platformImages(t *testing.T, idx v1.ImageIndex) map[string]v1.Image {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1.Image{}
	for _, d := range im.Manifests {
		if d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("index entry %s has media type %s, want %s", d.Digest, d.MediaType, types.OCIManifestSchema1)
		}
		if d.Platform == nil {
			t.Fatalf("index entry %s has no platform", d.Digest)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		out[d.Platform.OS+"/"+d.Platform.Architecture] = img
	}
	return out
}

// files reads every layer of img and returns the headers by path (later layers win).
func files(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	for _, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			t.Fatal(err)
		}
		if mt != types.OCILayer {
			t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
		}
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		var names []string
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
			p := strings.TrimSuffix(h.Name, "/")
			hdrs[p] = h
			if h.Typeflag == tar.TypeReg {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				data[p] = b
			}
		}
		rc.Close()
		if !sort.StringsAreSorted(names) {
			t.Errorf("layer entries are not sorted (the tar bytes would depend on walk order): %v", names)
		}
	}
	return hdrs, data
}

// TestImageShape checks each image of each platform: config, labels, file system and binary.
func TestImageShape(t *testing.T) {
	if len(first) != 2 {
		t.Fatalf("built %d images, want nodevigil-agent and nodevigil-remediator", len(first))
	}
	for _, img := range first {
		t.Run(img.Binary.Name, func(t *testing.T) {
			mt, err := img.Index.MediaType()
			if err != nil || mt != types.OCIImageIndex {
				t.Errorf("index media type %s (%v), want %s", mt, err, types.OCIImageIndex)
			}
			byPlatform := platformImages(t, img.Index)
			var plats []string
			for p := range byPlatform {
				plats = append(plats, p)
			}
			sort.Strings(plats)
			if !slices.Equal(plats, []string{"linux/amd64", "linux/arm64"}) {
				t.Fatalf("platforms %v, want linux/amd64 and linux/arm64", plats)
			}
			im, err := img.Index.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if im.Annotations[imagebuild.LabelVersion] != testVersion || im.Annotations[imagebuild.LabelRevision] != testCommit {
				t.Errorf("index annotations %v lack version %s and revision %s", im.Annotations, testVersion, testCommit)
			}
			for plat, pimg := range byPlatform {
				t.Run(plat, func(t *testing.T) { checkPlatformImage(t, img.Binary.Name, plat, pimg) })
			}
		})
	}
}

func checkPlatformImage(t *testing.T, name, plat string, img v1.Image) {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cf.OS + "/" + cf.Architecture; got != plat {
		t.Errorf("config platform %s, index says %s", got, plat)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", cf.Config.User)
	}
	bin := "/usr/local/bin/" + name
	if !slices.Equal(cf.Config.Entrypoint, []string{bin}) || len(cf.Config.Cmd) > 0 {
		t.Errorf("entrypoint %q cmd %q, want [%s] and no cmd", cf.Config.Entrypoint, cf.Config.Cmd, bin)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.source":   "https://github.com/nodevigil/nodevigil",
		"org.opencontainers.image.version":  testVersion,
		"org.opencontainers.image.revision": testCommit,
		"org.opencontainers.image.title":    name,
	}
	for k, v := range wantLabels {
		if cf.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
		}
	}
	if !cf.Created.IsZero() {
		t.Errorf("created %s, want zero (the build time would change the digest)", cf.Created)
	}
	mt, err := img.MediaType()
	if err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s (%v), want OCI", mt, err)
	}

	hdrs, data := files(t, img)
	var paths []string
	for p := range hdrs {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	want := []string{"etc", "etc/group", "etc/passwd", "home", "home/nonroot", "tmp", "usr", "usr/local", "usr/local/bin", strings.TrimPrefix(bin, "/")}
	if !slices.Equal(paths, want) {
		t.Errorf("image files %v, want exactly %v (no shell, no package manager)", paths, want)
	}
	for p, h := range hdrs {
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s mtime %s, want the epoch", p, h.ModTime)
		}
		if p != "home/nonroot" && (h.Uid != 0 || h.Gid != 0) {
			t.Errorf("%s owned by %d:%d, want root (the process must not change its own files)", p, h.Uid, h.Gid)
		}
	}
	if h := hdrs[strings.TrimPrefix(bin, "/")]; h == nil || h.Mode&0o111 == 0 || h.Mode&0o022 != 0 {
		t.Errorf("binary header %+v, want executable and not group/world-writable", h)
	}
	if !strings.Contains(string(data["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd does not name uid 65532:\n%s", data["etc/passwd"])
	}

	f, err := elf.NewFile(bytes.NewReader(data[strings.TrimPrefix(bin, "/")]))
	if err != nil {
		t.Fatalf("binary is not ELF: %v", err)
	}
	wantMachine := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}[plat]
	if f.Machine != wantMachine {
		t.Errorf("binary machine %s, want %s", f.Machine, wantMachine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %s program header: not static (CGO_ENABLED=0 missing?)", p.Type)
		}
	}
}

// TestReproducible compares the two builds: every index and platform manifest digest is equal.
func TestReproducible(t *testing.T) {
	for i := range first {
		a, b := first[i], second[i]
		if da, db := digest(t, a.Index), digest(t, b.Index); da != db {
			ia, _ := a.Index.RawManifest()
			ib, _ := b.Index.RawManifest()
			t.Errorf("%s: the same inputs gave two index digests %s and %s:\n%s\n%s", a.Binary.Name, da, db, ia, ib)
		}
	}
}

// TestLayout reads the OCI image layout written to disk back and checks it holds the index
// under its version name with the same digest.
func TestLayout(t *testing.T) {
	for _, img := range first {
		dir := filepath.Join(layoutDir, img.Binary.Name)
		raw, err := os.ReadFile(filepath.Join(dir, "oci-layout"))
		if err != nil {
			t.Fatal(err)
		}
		var ol struct {
			Version string `json:"imageLayoutVersion"`
		}
		if err := json.Unmarshal(raw, &ol); err != nil || ol.Version != "1.0.0" {
			t.Errorf("%s/oci-layout = %s (%v), want imageLayoutVersion 1.0.0", dir, raw, err)
		}
		root, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		im, err := root.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(im.Manifests) != 1 {
			t.Fatalf("%s/index.json has %d entries, want 1", dir, len(im.Manifests))
		}
		d := im.Manifests[0]
		if d.MediaType != types.OCIImageIndex || d.Digest != digest(t, img.Index) || d.Annotations[imagebuild.RefName] != testVersion {
			t.Errorf("%s/index.json entry %+v, want the image index %s named %s", dir, d, digest(t, img.Index), testVersion)
		}
		onDisk, err := root.ImageIndex(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		for _, pimg := range platformImages(t, onDisk) {
			layers, err := pimg.Layers()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range layers {
				if _, err := os.Stat(filepath.Join(dir, "blobs", "sha256", digest(t, l).Hex)); err != nil {
					t.Errorf("layer blob missing from the layout: %v", err)
				}
			}
		}
	}
}

// TestPushPullRun pushes each image index to an OCI registry (go-containerregistry's registry,
// served over HTTP in process), pulls it back by tag, and runs the binary for this machine's
// architecture from the pulled layer with --version.
func TestPushPullRun(t *testing.T) {
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		t.Fatalf("this test runs an image's binary and needs linux/amd64 or linux/arm64, not %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, img := range first {
		t.Run(img.Binary.Name, func(t *testing.T) {
			ref, err := name.ParseReference(host+"/nodevigil/"+img.Binary.Name+":"+testVersion, name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.WriteIndex(ref, img.Index, remote.WithContext(t.Context())); err != nil {
				t.Fatalf("push %s: %v", ref, err)
			}
			pulled, err := remote.Index(ref, remote.WithContext(t.Context()))
			if err != nil {
				t.Fatalf("pull %s: %v", ref, err)
			}
			if got, want := digest(t, pulled), digest(t, img.Index); got != want {
				t.Fatalf("pulled digest %s, pushed %s", got, want)
			}
			pimg := platformImages(t, pulled)["linux/"+runtime.GOARCH]
			if pimg == nil {
				t.Fatalf("pulled index has no linux/%s image", runtime.GOARCH)
			}
			_, data := files(t, pimg)
			bin := data["usr/local/bin/"+img.Binary.Name]
			if len(bin) == 0 {
				t.Fatal("pulled image has no binary")
			}
			exe := filepath.Join(t.TempDir(), path.Base(img.Binary.Name))
			if err := os.WriteFile(exe, bin, 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := exec.CommandContext(t.Context(), exe, "--version").CombinedOutput()
			if err != nil {
				t.Fatalf("%s --version: %v\n%s", img.Binary.Name, err, out)
			}
			want := fmt.Sprintf("%s %s (commit %s, %s)", img.Binary.Name, testVersion, testCommit, runtime.Version())
			if strings.TrimSpace(string(out)) != want {
				t.Errorf("%s --version printed %q, want %q", img.Binary.Name, out, want)
			}
		})
	}
}

// TestOptionsValidation checks that a build without a version or commit is refused with the
// field named, before anything is compiled.
func TestOptionsValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    imagebuild.Options
		want string
	}{
		{"no root", imagebuild.Options{Version: "v1", Commit: "c"}, "Options.Root is empty"},
		{"no version", imagebuild.Options{Root: ".", Commit: "c"}, "Options.Version is empty"},
		{"no commit", imagebuild.Options{Root: ".", Version: "v1"}, "Options.Commit is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := imagebuild.Build(t.Context(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
