# sluice — a drop-in replacement for kube-proxy.
# `make help` lists the targets. Tests that need root, network namespaces or the real
# kube-apiserver are in `make test`; `make test-unit` needs none of them and takes seconds.
# `make test` first checks (hack/prereqs.sh) everything its tiers need, installing missing
# apt packages when it runs as root, so it never stops half-way for a missing tool.

SHELL       := /usr/bin/env bash
GO          ?= go
BIN         := bin
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X github.com/sluiceproxy/sluice/pkg/version.Version=$(VERSION)
MODE        ?= iptables
GOTESTFLAGS ?=

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/sluice (static) and the test helper binaries.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/sluice ./cmd/sluice
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/echoserver ./test/echoserver

.PHONY: prereqs
prereqs: ## Check what make test needs (root, Go, packages, kernel features, disk); install missing apt packages.
	hack/prereqs.sh all

.PHONY: test-unit
test-unit: ## Fast tier: unit, golden and fake-backed tests; no root, no netns, seconds.
	GOTESTFLAGS='$(GOTESTFLAGS)' hack/test-unit.sh

.PHONY: test-race
test-race: ## The packages that run goroutines, under the race detector (cgo: gcc).
	hack/prereqs.sh race
	GOTESTFLAGS='$(GOTESTFLAGS)' hack/test-race.sh

.PHONY: verify
verify: ## gofmt, go vet, golangci-lint (.golangci.yml), the logging rule and the import-direction rules.
	hack/verify.sh

.PHONY: test-kernel
test-kernel: build ## Backends against the real kernel, each test in its own network namespace (root).
	hack/prereqs.sh kernel
	hack/test-kernel.sh

.PHONY: test-e2e
test-e2e: build ## sluice (built with -race) against a real etcd + kube-apiserver (recording backend).
	hack/prereqs.sh e2e
	hack/test-e2e.sh

.PHONY: test-conformance
test-conformance: build ## Real-packet conformance suite in netns nodes, iptables and nftables backends (root).
	hack/prereqs.sh conformance
	hack/test-conformance.sh

.PHONY: test-ipvs
test-ipvs: build ## IPVS backend and conformance suite inside a qemu VM running Debian's kernel.
	hack/prereqs.sh ipvs
	hack/ipvs-vm.sh

.PHONY: test
test: prereqs verify test-unit test-race test-kernel test-e2e test-conformance test-ipvs ## Everything CI runs.

.PHONY: fuzz
fuzz: ## Fuzz the model for FUZZTIME (default 30s) per target; seed corpora live in testdata/fuzz.
	hack/fuzz.sh

.PHONY: bench
bench: build ## Benchmarks: the backends against the kernel, then hack/scale against upstream (every figure of docs/benchmarks.md, about 2.5 h).
	hack/bench.sh

.PHONY: control-plane
control-plane: ## Build (once, cached) the real kube-apiserver and etcd used by tests and the sandbox.
	hack/control-plane.sh

.PHONY: demo
demo: build ## Sandbox: real apiserver, two netns nodes, pods and Services; MODE=iptables|nftables|ipvs.
	MODE=$(MODE) hack/demo.sh up

.PHONY: demo-down
demo-down: ## Tear the sandbox down, leaving nothing behind.
	hack/demo.sh down

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN)
