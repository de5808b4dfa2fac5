// Package imagebuild builds nodevigil's container images without a container daemon or a base
// image: it cross-compiles each binary statically for every platform, packs it with a minimal
// root filesystem into OCI layers, and assembles one multi-platform OCI image index per binary
// with github.com/google/go-containerregistry as a library.
//
// The images are reproducible: the same source, Go toolchain and Options give the same index
// digest. Nothing in them depends on when or where they were built: the Go build uses
// -trimpath and an empty build ID, tar entries are sorted and carry a fixed mtime and owner,
// gzip writes no timestamp, and the image config's created time is fixed (zero unless
// Options.Created is set, e.g. from SOURCE_DATE_EPOCH).
//
// Each image holds two layers: a base layer shared by every image (/etc/passwd and /etc/group
// naming the non-root user 65532, an empty /tmp) and the binary at /usr/local/bin/<name>.
// There is no shell and no CA bundle file: both binaries embed Mozilla's roots through
// golang.org/x/crypto/x509roots/fallback, used only when the system has none.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// User is the numeric user and group the images run as: "nonroot" in distroless, so that
// security tooling recognises it, and never uid 0.
const User = "65532"

// Source is the repository the images are built from (the org.opencontainers.image.source
// label, which GitHub's registry also uses to link a package to its repository).
const Source = "https://github.com/nodevigil/nodevigil"

// OCI annotation and label keys (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
const (
	LabelSource   = "org.opencontainers.image.source"
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelTitle    = "org.opencontainers.image.title"
	LabelDesc     = "org.opencontainers.image.description"
	// RefName names an image in an OCI layout's index.json (what `skopeo copy oci:DIR:TAG`
	// and `crane` select by).
	RefName = "org.opencontainers.image.ref.name"
)

// Binary is one program to ship as an image.
type Binary struct {
	// Name is the image and binary name, e.g. nodevigil-agent.
	Name string
	// Package is the Go package path of its main, relative to the module root (./agent/cmd/...).
	Package string
	// Description becomes the org.opencontainers.image.description label.
	Description string
}

// Binaries are the images nodevigil ships.
var Binaries = []Binary{
	{Name: "nodevigil-agent", Package: "./agent/cmd/nodevigil-agent",
		Description: "nodevigil per-node agent: node conditions, startup taints, heartbeat Lease"},
	{Name: "nodevigil-remediator", Package: "./remediation/cmd/nodevigil-remediator",
		Description: "nodevigil remediator: detects dead nodes and replaces them (cordon, drain, terminate)"},
}

// Platforms are the default image platforms: x86 and Graviton nodes.
var Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

// Options configure a build.
type Options struct {
	// Root is the module root (where go.mod is).
	Root string
	// Version is stamped into the binaries (main.version) and the version label, e.g. v0.1.0.
	Version string
	// Commit is stamped into the binaries (main.commit) and the revision label.
	Commit string
	// Created is the images' creation time and every file's mtime; zero keeps both at the
	// Unix epoch / unset, so only the inputs decide the digest.
	Created time.Time
	// Platforms to build; default Platforms.
	Platforms []v1.Platform
	// Binaries to build; default Binaries.
	Binaries []Binary
	// Go is the go command; default "go".
	Go string
	// WorkDir holds the compiled binaries; default a temporary directory removed afterwards.
	WorkDir string
	// Log receives one line per step; nil discards.
	Log io.Writer
}

// Image is one built multi-platform image.
type Image struct {
	Binary Binary
	Index  v1.ImageIndex
}

func (o *Options) defaults() error {
	if o.Root == "" {
		return errors.New("imagebuild: Options.Root is empty: set it to the module root (the directory with go.mod)")
	}
	if o.Version == "" {
		return errors.New("imagebuild: Options.Version is empty: set it, e.g. to `git describe --tags --always --dirty`")
	}
	if o.Commit == "" {
		return errors.New("imagebuild: Options.Commit is empty: set it to `git rev-parse HEAD`")
	}
	if len(o.Platforms) == 0 {
		o.Platforms = Platforms
	}
	if len(o.Binaries) == 0 {
		o.Binaries = Binaries
	}
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}

// Build compiles every binary for every platform and assembles one OCI image index per binary.
func Build(ctx context.Context, o Options) ([]Image, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	work := o.WorkDir
	if work == "" {
		tmp, err := os.MkdirTemp("", "nodevigil-images-")
		if err != nil {
			return nil, fmt.Errorf("imagebuild: work directory: %w", err)
		}
		defer os.RemoveAll(tmp)
		work = tmp
	}
	base, err := baseLayer(o.Created)
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, b := range o.Binaries {
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		for _, p := range o.Platforms {
			bin := filepath.Join(work, p.OS+"-"+p.Architecture, b.Name)
			if err := compile(ctx, o, b, p, bin); err != nil {
				return nil, err
			}
			img, err := image(o, b, p, base, bin)
			if err != nil {
				return nil, err
			}
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
				Add:        img,
				Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}},
			})
		}
		idx = mutate.Annotations(idx, labels(o, b)).(v1.ImageIndex)
		out = append(out, Image{Binary: b, Index: idx})
	}
	return out, nil
}

// compile builds one static binary. GOAMD64/GOARM64 are pinned so that the host's environment
// cannot change the code generated, and with it the digest.
func compile(ctx context.Context, o Options, b Binary, p v1.Platform, dst string) error {
	ldflags := strings.Join([]string{
		"-s", "-w", "-buildid=",
		"-X", "main.version=" + o.Version,
		"-X", "main.commit=" + o.Commit,
	}, " ")
	cmd := exec.CommandContext(ctx, o.Go, "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", dst, b.Package)
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(),
		"CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture,
		"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=-mod=readonly",
	)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = o.Log, &stderr
	fmt.Fprintf(o.Log, "building %s for %s/%s\n", b.Name, p.OS, p.Architecture)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("imagebuild: go build %s for %s/%s: %w\n%s", b.Package, p.OS, p.Architecture, err, stderr.Bytes())
	}
	return nil
}

// image assembles the single-platform image of one binary.
func image(o Options, b Binary, p v1.Platform, base v1.Layer, bin string) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: read %s: %w", bin, err)
	}
	binLayer, err := layer(o.Created, []entry{
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: "usr/local/bin/" + b.Name, mode: 0o755, data: data},
	})
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	created := v1.Time{Time: o.Created}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "nodevigil build/images: base files (passwd, group, tmp)"}},
		mutate.Addendum{Layer: binLayer, History: v1.History{Created: created, CreatedBy: "nodevigil build/images: " + b.Package}},
	)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = created
	cf.Config = v1.Config{
		User:       User + ":" + User,
		Entrypoint: []string{"/usr/local/bin/" + b.Name},
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin"},
		Labels:     labels(o, b),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: set config: %w", err)
	}
	return img, nil
}

func labels(o Options, b Binary) map[string]string {
	return map[string]string{
		LabelSource:   Source,
		LabelVersion:  o.Version,
		LabelRevision: o.Commit,
		LabelTitle:    b.Name,
		LabelDesc:     b.Description,
	}
}

// baseLayer holds the files every image shares: the user database naming 65532 (so that tools
// and error messages show a name, not "I have no name!") and a world-writable, sticky /tmp.
func baseLayer(created time.Time) (v1.Layer, error) {
	return layer(created, []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:" + User + ":\n")},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:" + User + ":" + User + ":nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, dir: true, owner: 65532},
		{name: "tmp/", mode: 0o1777, dir: true},
	})
}

// entry is one file or directory of a layer.
type entry struct {
	name  string
	mode  int64
	dir   bool
	data  []byte
	owner int // uid and gid; 0 (root) for everything the process must not change
}

// layer writes entries, sorted by name, into a tar with fixed times and owners, and returns it
// as a gzip-compressed OCI layer.
func layer(created time.Time, entries []entry) (v1.Layer, error) {
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	mtime := created
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name: e.name, Mode: e.mode, ModTime: mtime.UTC(), Uid: e.owner, Gid: e.owner,
			Format: tar.FormatPAX,
		}
		if e.owner == 0 {
			h.Uname, h.Gname = "root", "root"
		}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("imagebuild: tar header %s: %w", e.name, err)
		}
		if !e.dir {
			if _, err := tw.Write(e.data); err != nil {
				return nil, fmt.Errorf("imagebuild: tar %s: %w", e.name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("imagebuild: close tar: %w", err)
	}
	raw := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: layer: %w", err)
	}
	return l, nil
}

// WriteLayout writes img as an OCI image layout (oci-layout, index.json, blobs/) into dir,
// replacing what was there. index.json names the image index by version (ref.name), so
// `skopeo copy oci:DIR:VERSION docker://...` and `crane push DIR ...` find it.
func WriteLayout(dir string, img Image, version string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("imagebuild: clear %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("imagebuild: create layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(img.Index, layout.WithAnnotations(map[string]string{RefName: version})); err != nil {
		return fmt.Errorf("imagebuild: write %s to %s: %w", img.Binary.Name, dir, err)
	}
	return nil
}
