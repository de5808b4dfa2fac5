// Command images builds nodevigil's container images (`make images`) without a container
// daemon, a base image or registry access: one OCI image index per binary (nodevigil-agent,
// nodevigil-remediator) for linux/amd64 and linux/arm64, each written as an OCI image layout
// under --output/<name> (oci-layout, index.json, blobs/).
//
// Copy an image to a registry with any OCI tool, e.g.
//
//	skopeo copy --all oci:_output/images/nodevigil-agent:v0.1.0 docker://ghcr.io/you/nodevigil-agent:v0.1.0
//	crane push _output/images/nodevigil-agent ghcr.io/you/nodevigil-agent:v0.1.0
//
// The same source, Go toolchain and flags give the same digests (see package imagebuild).
//
// Usage:
//
//	go run ./build/images --version v0.1.0 --commit $(git rev-parse HEAD) [--output _output/images]
//
// It prints one line per image: name, version and the index digest to pin in the chart
// (agent.image.digest, remediator.image.digest).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/nodevigil/nodevigil/build/images/imagebuild"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.String("version", "", "version stamped into the binaries and labels (required), e.g. v0.1.0")
	commit := fs.String("commit", "", "git commit stamped into the binaries and labels (required)")
	output := fs.String("output", "_output/images", "directory for the OCI image layouts, one sub-directory per image")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated os/arch list")
	root := fs.String("root", ".", "module root (the directory with go.mod)")
	verbose := fs.Bool("v", false, "print each build step")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	plats, err := parsePlatforms(*platforms)
	if err != nil {
		fmt.Fprintf(stderr, "images: --platforms: %v\n", err)
		return 2
	}
	// SOURCE_DATE_EPOCH (reproducible-builds.org) sets the creation time; unset keeps it zero.
	var created time.Time
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(stderr, "images: SOURCE_DATE_EPOCH=%q is not a number of seconds: %v\n", s, err)
			return 2
		}
		created = time.Unix(sec, 0).UTC()
	}
	o := imagebuild.Options{Root: *root, Version: *version, Commit: *commit, Created: created, Platforms: plats}
	if *verbose {
		o.Log = stderr
	}
	imgs, err := imagebuild.Build(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "images: %v\n", err)
		return 1
	}
	// values-digests.yaml pins the chart to exactly these images: helm install -f it.
	values := "# Written by `make images` (build/images): pins the chart to the images built for " + *version + ".\n"
	for _, img := range imgs {
		dir := filepath.Join(*output, img.Binary.Name)
		if err := imagebuild.WriteLayout(dir, img, *version); err != nil {
			fmt.Fprintf(stderr, "images: %v\n", err)
			return 1
		}
		d, err := img.Index.Digest()
		if err != nil {
			fmt.Fprintf(stderr, "images: digest of %s: %v\n", img.Binary.Name, err)
			return 1
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s\t%s\n", img.Binary.Name, *version, d, dir)
		values += fmt.Sprintf("%s:\n  image:\n    digest: %q\n", strings.TrimPrefix(img.Binary.Name, "nodevigil-"), d.String())
	}
	if err := os.WriteFile(filepath.Join(*output, "values-digests.yaml"), []byte(values), 0o644); err != nil {
		fmt.Fprintf(stderr, "images: %v\n", err)
		return 1
	}
	return 0
}

func parsePlatforms(s string) ([]v1.Platform, error) {
	var out []v1.Platform
	for _, f := range strings.Split(s, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", f, err)
		}
		if p.OS != "linux" || (p.Architecture != "amd64" && p.Architecture != "arm64") {
			return nil, fmt.Errorf("%q: only linux/amd64 and linux/arm64 are supported", f)
		}
		out = append(out, *p)
	}
	return out, nil
}
