# nodevigil — every development task is a make target. `make help` lists them.

GO          ?= go
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT      ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS     := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# make images writes one OCI image layout per image here; make chart the packaged chart.
IMAGES_DIR  ?= _output/images
CHART_DIR   ?= _output/chart
# SemVer version of the packaged chart (default: Chart.yaml's); its appVersion is VERSION.
CHART_VERSION ?=
BIN         := bin
# Extra flags for go test, e.g. GOTESTFLAGS=-v or GOTESTFLAGS='-run TestX'.
GOTESTFLAGS ?=
# Integration packages each start a real control plane; they run with this timeout.
INTEGRATION_TIMEOUT ?= 30m
# Test binaries run (and packages build) this many at a time. Most integration time is spent
# waiting on timers and processes, not CPU, so more than the core count helps (docs/benchmarks.md).
TESTP       ?= 4
# The longest integration packages, named first so that go test builds and starts them first
# (it schedules packages in the order given); ./... adds the rest once.
SLOW_PKGS   := $(patsubst %/,./%,$(wildcard integration/outage/ integration/remediator/ integration/scenarios/ integration/interruptions/ integration/awsevents/ integration/images/ integration/install/ integration/plugin/ integration/agent/))
# Every build that is not a -race test builds static (CGO_ENABLED=0) with -trimpath, as the
# container images must: one compiled copy of the dependencies serves the images, the binaries
# the end-to-end tests run, and the harness commands (make control-plane, make kwok, tools).
NORACE_GO   := CGO_ENABLED=0 $(GO)
UNIT_PKGS    = $(shell $(GO) list ./... | grep -v /integration)
INTEG_PKGS   = $(shell $(GO) list ./integration/...)
BENCHTIME   ?= 2s
BENCHCOUNT  ?= 6
# Extra flags for `devcluster up` (make run), e.g. RUNFLAGS=--fleet=false.
RUNFLAGS    ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build nodevigil-agent, nodevigil-remediator and kubectl-nodevigil into bin/ (static).
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/nodevigil-agent ./agent/cmd/nodevigil-agent
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/nodevigil-remediator ./remediation/cmd/nodevigil-remediator
	CGO_ENABLED=0 $(GO) build -ldflags '-s -w' -o $(BIN)/kubectl-nodevigil ./kubectl-nodevigil

.PHONY: test
test: control-plane ## Unit and integration tests, with -race (builds the control plane on first use).
	$(GO) test -race -count=1 -p $(TESTP) -timeout $(INTEGRATION_TIMEOUT) $(GOTESTFLAGS) $(SLOW_PKGS) ./...

.PHONY: test-unit
test-unit: ## Unit tests only (no control plane), with -race.
	$(GO) test -race -count=1 $(GOTESTFLAGS) $(UNIT_PKGS)

.PHONY: test-integration
test-integration: control-plane ## Integration tests on a real etcd + kube-apiserver + kube-controller-manager, with -race.
	$(GO) test -race -count=1 -p $(TESTP) -timeout $(INTEGRATION_TIMEOUT) $(GOTESTFLAGS) $(SLOW_PKGS) $(INTEG_PKGS)

.PHONY: lint
# vet and staticcheck load their dependencies from compiled export data; with -race (staticcheck:
# a one-build -matrix) that is the very build `make test` needs, so a cold checkout compiles the
# dependencies once for both, not twice. staticcheck (pinned: integration/tools) is installed
# static with -trimpath into the cache, sharing the standard library the binaries compiled.
lint: ## go vet, gofmt and staticcheck (pinned, built through the Go toolchain).
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet -race ./...
	@sc=$$($(NORACE_GO) run -trimpath ./integration/cmd/tools staticcheck | sed -n 's/^staticcheck=//p') && test -n "$$sc" && \
	echo "echo 'race: -race' | $$sc -matrix ./..." && echo 'race: -race' | "$$sc" -matrix ./...

.PHONY: bench
bench: ## Benchmarks (Go benchmarks plus the agent/remediator scripts at small scale); see docs/benchmarks.md.
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) $(UNIT_PKGS) | tee bench.out
	@echo "raw results in bench.out; summarise with: go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da bench.out"
	$(MAKE) bench-scripts

# The scripts on a real control plane, short enough for `make bench` (~8 min together). The
# figures in docs/benchmarks.md come from the longer runs it names (10,000 nodes, 10 minutes).
.PHONY: bench-scripts
bench-scripts: ## Agent steady state (3 min) and remediator at 2,000 nodes with 50 failing at once (~4 min).
	$(GO) run ./integration/bench/agentsteady -duration 3m -warmup 30s -baseline 1m | tee bench-agent.out
	$(GO) run ./integration/bench/remediatorscale -nodes 2000 -silence 50 -bulk-lease 60s -bulk-renew 40s -steady 60s | tee bench-remediator.out

# Differential fuzzing of the startup-taint grammar against k8s.io/kubernetes (a separate,
# test-only module; `go test ./...` never enters it). The first run downloads and builds
# k8s.io/kubernetes v1.34.2: ~1.5 min for the seed run, ~13 min for the instrumented fuzz
# build on 2 shared cores; later runs use the build cache.
FUZZTIME    ?= 30s
DIFFFUZZ    := collectors/kubelet/internal/difffuzz

.PHONY: fuzz
fuzz: ## Fuzz the taint and unit-file parsers in the main module (FUZZTIME each).
	$(GO) test -run='^$$' -fuzz='^FuzzParseRegisterWithTaints$$' -fuzztime=$(FUZZTIME) ./collectors/kubelet
	$(GO) test -run='^$$' -fuzz='^FuzzKubeletCmdline$$' -fuzztime=$(FUZZTIME) ./collectors/kubelet
	$(GO) test -run='^$$' -fuzz='^FuzzUnitParsers$$' -fuzztime=$(FUZZTIME) ./collectors/kubelet

.PHONY: fuzz-diff
fuzz-diff: ## Differential fuzz of the taint grammar against the kubelet and API server code (FUZZTIME each).
	cd $(DIFFFUZZ) && $(GO) test -count=1 .
	cd $(DIFFFUZZ) && $(GO) test -run='^$$' -fuzz='^FuzzRegisterWithTaintsFlag$$' -fuzztime=$(FUZZTIME) .
	cd $(DIFFFUZZ) && $(GO) test -run='^$$' -fuzz='^FuzzConfigTaints$$' -fuzztime=$(FUZZTIME) .

.PHONY: run
run: build control-plane kwok ## Run nodevigil locally: control plane, EC2 emulator, a simulated fleet (kwok), agents, remediator.
	$(GO) run ./integration/cmd/devcluster up $(RUNFLAGS)

.PHONY: control-plane
control-plane: ## Find or build etcd, kube-apiserver and kube-controller-manager; print their paths.
	@$(NORACE_GO) run -trimpath ./integration/cmd/devcluster paths

.PHONY: kwok
kwok: ## Find or build kwok (the fleet's simulated kubelets, for make run and the scenario tests); print its path.
	@$(NORACE_GO) run -trimpath ./integration/cmd/devcluster kwok

.PHONY: tools
tools: ## Find or fetch helm, kustomize and promtool (integration/tools) into the cache; print their paths.
	@$(NORACE_GO) run -trimpath ./integration/cmd/tools

.PHONY: timeline
timeline: control-plane kwok ## Regenerate docs/remediation-timeline.svg from a real run (scenario S000's Events and remediator metrics).
	NODEVIGIL_TIMELINE_SVG=$(CURDIR)/docs/remediation-timeline.svg $(GO) test -count=1 -run '^TestS000' ./integration/scenarios/

.PHONY: manifests
manifests: ## Render manifests/install.yaml and manifests/kustomize/nodevigil.yaml from the Helm chart.
	bash manifests/render.sh

.PHONY: verify-manifests
verify-manifests: ## Fail when manifests/install.yaml or the kustomize base is stale.
	bash manifests/verify.sh

.PHONY: images
images: ## Build the agent and remediator images (linux/amd64+arm64, no docker) as OCI layouts in _output/images.
	$(GO) run ./build/images --version $(VERSION) --commit $(COMMIT) --output $(IMAGES_DIR)

.PHONY: test-images
test-images: ## Build both images twice and test them (platforms, user, labels, digest, push/pull, --version).
	$(GO) test -race -count=1 $(GOTESTFLAGS) ./integration/images/

.PHONY: chart
chart: ## Package the Helm chart into _output/chart with appVersion=VERSION.
	bash manifests/package.sh $(VERSION) "$(CHART_VERSION)" $(CHART_DIR)

.PHONY: clean
clean: ## Remove build output (not the control-plane cache in ~/.cache/nodevigil).
	rm -rf $(BIN) bench.out bench-agent.out bench-remediator.out _output
