# kshard's build. `make run` starts the local sandbox; `make test` runs every
# test against a real control plane built from pinned upstream sources.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

BIN := $(CURDIR)/bin
# A user's own KUBEBUILDER_ASSETS wins; otherwise the control plane we build.
export KUBEBUILDER_ASSETS ?= $(BIN)/k8s
CONTROLLER_GEN := $(BIN)/controller-gen
# promtool and promql-selectors, built from the pinned Prometheus module
# (hack/prometheus): the tests of the alert rules and shipped queries run
# them from here.
export PROMTOOL := $(BIN)/promtool
export PROMQL_SELECTORS := $(BIN)/promql-selectors
# The Prometheus server the load tester measures through (its figures are
# PromQL over the services' own /metrics), from the same pinned module.
export PROMETHEUS := $(BIN)/prometheus
# SpiceDB, the authorization system of the tests and the sandbox, built from
# the module hack/spicedb pins.
export SPICEDB := $(BIN)/spicedb/spicedb
# Prometheus's own build tags for leaving out every service discovery but
# Kubernetes's (the cloud SDKs): on an empty build cache promtool,
# promql-selectors and the node's Prometheus compile in 3 min 32 s with them
# against 9 min 28 s without (hack/image/build.sh uses the same).
PROMETHEUS_TAGS := remove_all_sd,enable_kubernetes_sd
# -ldflags=-w: no DWARF in the test binaries. Nothing in a test run reads it
# (stack traces and race reports use the symbol table), and writing it is
# about a quarter of each race-instrumented binary's link (1.5 of 6 CPU
# seconds), which make test pays for every test binary it links.
#
# -p 4: go test runs four test binaries at once, not GOMAXPROCS (two here).
# The integration packages mostly wait, on Leases, informers and child
# processes: two at a time left the two cores a third idle (231 CPU-s in
# 176 s of make test), four at a time keeps them busy.
GO_TEST_FLAGS ?= -race -count=1 -timeout 45m -ldflags=-w -p 4
# The race detector's runtime sleeps a second before a process exits, by
# default so that other threads can finish a race report; a test binary
# exits after its tests have ended, and so do the replica processes the
# tests stop, which make test waits for dozens of times. A GORACE of the
# user's own is kept.
export GORACE ?= atexit_sleep_ms=0
# The modules of go.work: the main one (the libraries, the controller and
# the sandbox) and the four kept apart so that their dependencies never reach
# the main go.mod, and with it a library user's module graph: the load
# tester (goja, esbuild, kustomize), the end-to-end suite, deploy/'s tests
# (kind, kustomize) and the custom metrics adapter (custom-metrics-apiserver).
# ./... names only the main module's packages; each module is named here.
MODULES := . ./loadtest ./e2e ./deploy ./cmd/kshard-metrics-adapter
PACKAGES := $(addsuffix /...,$(MODULES))
# Every package with tests, the slowest first: go test runs them -p at a
# time in the order given, so the long ones start at once and the short ones
# fill in around them. In ./... order the slowest, sharding, came last and
# ran alone for minutes. Packages without tests are left out (make test vets,
# and so compiles, every package first), and loadtest/cmd/loadtest is tested
# on its own: its test binary has the loadtest package's name, loadtest.test,
# and both cannot be kept in one folder (TEST_BIN below).
TEST_PACKAGES ?= ./sharding ./reconcile/configbinding ./loadtest ./deploy ./internal/sandbox ./cmd/kshard \
	$(shell go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' $(PACKAGES) | grep -v '/loadtest/cmd/loadtest$$')
# go test links every test binary anew on each run (half a minute of CPU
# per make test here), unless it is told to keep it: with -o, a binary whose
# inputs did not change is found up to date and not linked again. Both test
# lanes build the same binaries (-short is read when a test runs), so
# switching lanes links nothing either.
TEST_BIN := $(BIN)/test
# go_test runs go test on TEST_PACKAGES and loadtest/cmd/loadtest, with extra
# flags. It links every test binary (-c) before it runs any: on a cold build
# cache (CI), -p 4 would otherwise run the first tests beside three compiles,
# and the tests' Lease renewals would wait behind them.
define go_test
	go test $(GO_TEST_FLAGS) -c -o $(TEST_BIN)/ $(TEST_PACKAGES)
	go test $(GO_TEST_FLAGS) -c -o $(TEST_BIN)/cmd/ ./loadtest/cmd/loadtest
	go test $(GO_TEST_FLAGS) $(1) -o $(TEST_BIN)/ $(TEST_PACKAGES)
	go test $(GO_TEST_FLAGS) $(1) -o $(TEST_BIN)/cmd/ ./loadtest/cmd/loadtest
endef
RUN_ARGS ?=

.PHONY: all
all: build

##@ Development

.PHONY: run
run: controlplane spicedb ## Start the local sandbox (control plane, etcd as config center, SpiceDB, three replicas).
	go build -o $(BIN)/ ./cmd/kshard ./cmd/kshard-dev
	$(BIN)/kshard-dev $(RUN_ARGS)

.PHONY: test
test: controlplane-if-needed prometheus-tools spicedb ## Run every test with the race detector against a real control plane.
	go vet $(PACKAGES)
	$(call go_test)

.PHONY: test-unit
test-unit: prometheus-tools ## The fast lane while editing: tests that need no control plane (-short), with the race detector.
	$(call go_test,-short)

.PHONY: lint
lint: ## gofmt check of every Go file; go vet of go.work's modules, hack/controlplane/etcd and hack/prometheus.
	@files=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	if [[ -n $$files ]]; then echo "not gofmt-clean:"; echo "$$files"; exit 1; fi
	go vet $(PACKAGES)
	cd hack/controlplane/etcd && GOWORK=off go vet ./...
	cd hack/prometheus && GOWORK=off go vet ./...

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code for the API types.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRDs into deploy/crd.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=deploy/crd

.PHONY: build
build: ## Build every command (kshard, kshard-dev, configcenter, plaincontroller, kshard-metrics-adapter, loadtest) into bin/.
	go build -o $(BIN)/ ./cmd/... ./cmd/kshard-metrics-adapter ./loadtest/cmd/loadtest

##@ Control plane

.PHONY: controlplane
controlplane: ## Build etcd and kube-apiserver from pinned sources into bin/k8s (skipped when present).
	hack/controlplane/build.sh $(BIN)/k8s

# make test builds the control plane only when it is ours to build: a user's
# own KUBEBUILDER_ASSETS, or an existing cluster, is used as it is.
.PHONY: controlplane-if-needed
controlplane-if-needed:
	@if [[ "$${USE_EXISTING_CLUSTER:-}" == true ]]; then echo "using the cluster of the current kubeconfig"; \
	elif [[ "$(KUBEBUILDER_ASSETS)" != "$(BIN)/k8s" ]]; then echo "using KUBEBUILDER_ASSETS=$(KUBEBUILDER_ASSETS)"; \
	else $(MAKE) --no-print-directory controlplane; fi

.PHONY: prometheus-tools
prometheus-tools: $(PROMTOOL) $(PROMQL_SELECTORS) $(PROMETHEUS) ## Build promtool, promql-selectors and the Prometheus server from the pinned module into bin/.

$(PROMETHEUS): hack/prometheus/go.mod
	cd hack/prometheus && GOWORK=off go build -tags $(PROMETHEUS_TAGS) -o $@ github.com/prometheus/prometheus/cmd/prometheus

$(PROMTOOL): hack/prometheus/go.mod
	cd hack/prometheus && GOWORK=off go build -tags $(PROMETHEUS_TAGS) -o $@ github.com/prometheus/prometheus/cmd/promtool

$(PROMQL_SELECTORS): hack/prometheus/go.mod $(wildcard hack/prometheus/cmd/promql-selectors/*.go)
	cd hack/prometheus && GOWORK=off go build -tags $(PROMETHEUS_TAGS) -o $@ ./cmd/promql-selectors

.PHONY: spicedb
spicedb: $(SPICEDB) ## Build SpiceDB from the pinned module (hack/spicedb) into bin/spicedb.

$(SPICEDB): hack/spicedb/go.mod
	cd hack/spicedb && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o $@ github.com/authzed/spicedb/cmd/spicedb

$(CONTROLLER_GEN): hack/tools/go.mod
	cd hack/tools && GOWORK=off go build -o $(CONTROLLER_GEN) sigs.k8s.io/controller-tools/cmd/controller-gen

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Cluster

# The image that deploy/kind runs (kshard:dev, never pulled). CONTAINER_TOOL
# may be podman.
IMAGE ?= kshard:dev
KIND_CLUSTER ?= kshard
CONTAINER_TOOL ?= docker

.PHONY: image
image: ## Build the container image IMAGE (default kshard:dev): the kshard, kshard-metrics-adapter and configcenter binaries, static, non-root.
	$(CONTAINER_TOOL) build -t $(IMAGE) .

.PHONY: kind-up
kind-up: ## Create the kind cluster of deploy/kind/cluster.yaml.
	kind create cluster --name $(KIND_CLUSTER) --config deploy/kind/cluster.yaml

.PHONY: kind-load
kind-load: ## Copy the image IMAGE into the kind cluster's nodes.
	kind load docker-image $(IMAGE) --name $(KIND_CLUSTER)

.PHONY: deploy
deploy: ## Apply deploy/kind (CRDs, RBAC, three replicas, config center) to the current kubectl context.
	kubectl apply --server-side -k deploy/kind

.PHONY: kind-webhook-cert
kind-webhook-cert: ## Generate the self-signed certificate deploy/kind-webhook uses (for clusters without cert-manager).
	go run ./hack/webhookcert -out deploy/kind-webhook/generated

.PHONY: undeploy
undeploy: ## Delete what `make deploy` applied, the CRDs included: every ConfigBinding goes with them.
	kubectl delete --ignore-not-found -k deploy/kind

##@ Node

# A real single-node Kubernetes v1.37.2 on this machine, inside network
# namespace kshard-node (needs root): docs/cluster.md.
CLUSTER_KUBECONFIG := $(BIN)/cluster/kubeconfig

.PHONY: node-binaries
node-binaries: ## Build kubelet, kube-controller-manager, kube-scheduler, kube-proxy, kubectl and pause into bin/node (skipped when present).
	hack/node/build.sh $(BIN)/node

.PHONY: node-images
node-images: node-binaries ## Write the kshard:dev, etcd:dev, spicedb:dev, prometheus:dev, keda:dev and pause images as archives into bin/images, with no container engine.
	hack/image/build.sh $(BIN)

.PHONY: cluster
cluster: controlplane node-binaries node-images ## Start the single-node cluster (kubeconfig: bin/cluster/kubeconfig).
	hack/cluster/up.sh

.PHONY: cluster-down
cluster-down: ## Stop the cluster and remove its processes, network namespace, cgroups and state.
	hack/cluster/down.sh

.PHONY: cluster-smoke
cluster-smoke: ## On the running cluster: a kshard:dev pod runs, deploy/node's 3 replicas become Ready, a ConfigBinding syncs.
	hack/cluster/smoke.sh

.PHONY: e2e
e2e: ## On the running cluster: install deploy/ (e2e/overlay) and a Prometheus with the shipped alerts, 2,000 objects, the example controller examples/teamdigest beside kshard, scale 3→5→2, rollout restart, SIGKILL, an unowned-shards alert, partition and control-plane restarts, HPA through kshard-metrics-adapter and through KEDA; audit the pods and the API server.
	@[[ -s $(CLUSTER_KUBECONFIG) ]] || { echo "no cluster: run \`make cluster\` first (docs/cluster.md)" >&2; exit 1; }
	$(MAKE) --no-print-directory cluster-images
	KSHARD_E2E_KUBECONFIG=$(CLUSTER_KUBECONFIG) KSHARD_E2E_KUBECTL=$(BIN)/node/kubectl KSHARD_E2E_CONTAINERD=$(BIN)/cluster/run/containerd.sock KSHARD_E2E_APISERVER_AUDIT=$(BIN)/cluster/log/kube-apiserver-audit.log KSHARD_E2E_FAULT=$(CURDIR)/hack/cluster/fault.sh go test -count=1 -timeout 60m -v ./e2e/

.PHONY: cluster-images
cluster-images: node-images ## Rebuild the images and import them into the running cluster's containerd.
	hack/cluster/images.sh

.PHONY: lint-node
lint-node: ## Vet the image tool's module and shellcheck the node and cluster scripts (if shellcheck is installed).
	cd hack/image && GOWORK=off go vet ./...
	@if command -v shellcheck >/dev/null; then shellcheck -x hack/cluster/*.sh hack/node/build.sh hack/image/build.sh; else echo "shellcheck not installed: scripts not checked"; fi
