package controlplane

import (
	"context"
	"regexp"
)

// KwokVersion is the kwok release the simulated fleet runs (`make run`, the scenario tests).
// kwok plays the kubelets: it registers nothing itself, but keeps the Nodes it is told to
// manage Ready, renews their kube-node-lease Leases and runs their pods.
const KwokVersion = "v0.7.0"

var kwokComponent = component{
	name: "kwok", version: KwokVersion, module: "kwok",
	// A kwok built with plain `go build` has no version stamped in; its --version line still
	// names the program, and the cache directory carries the version.
	versionRE:   regexp.MustCompile(`(?i)kwok`),
	pkg:         "sigs.k8s.io/kwok/cmd/kwok",
	ldflags:     "-s -w",
	cacheSubdir: "kwok-" + KwokVersion + buildModuleKey("kwok"),
}

// FindOrBuildKwok returns the path of a kwok binary: from $NODEVIGIL_CONTROL_PLANE_ASSETS when
// it holds one, else from the cache, else built from the Go module proxy at KwokVersion (about
// a minute cold on two cores; cached next to the control plane, under the same lock). Only the
// callers that simulate a fleet need it, so `make test` builds it only for those packages.
func FindOrBuildKwok(ctx context.Context, cfg BuildConfig) (string, error) {
	if err := cfg.defaults(); err != nil {
		return "", err
	}
	if p, ok := findExisting(ctx, cfg, kwokComponent); ok {
		return p, nil
	}
	if err := buildCached(ctx, cfg, []component{kwokComponent}); err != nil {
		return "", err
	}
	return cachedPath(cfg, kwokComponent), nil
}
