# paysvc: make demo (run it with demo traffic), make test (all tests).
GO      ?= go
# The release, from the VERSION file (semantic versioning: X.Y.Z for a
# release, X.Y.Z-dev between releases), stamped into the binary (`paysvc
# version`, paysvc_build_info) and the image (its tag and OCI labels). Only
# a command-line VERSION= overrides it, not the environment.
VERSION := $(shell cat VERSION)
# The commit, -dirty with uncommitted changes. GOFLAGS here may carry
# -buildvcs=false: the revision is stamped explicitly.
REVISION ?= $(shell r=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null || r=$$r-dirty; } && echo $$r)
BIN     ?= bin
IMAGE   ?= paysvc
DOCKER  ?= docker
TESTFLAGS ?= -race -count=1 -timeout 15m

.PHONY: build release services test-tools test test-tidb test-k8s rules lint demo chaos chaos-cluster soak bench bench-large bench-large-drop clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.revision=$(REVISION)" -o $(BIN)/paysvc ./cmd/paysvc

# A release: VERSION a release (X.Y.Z, or X.Y.Z-rc.N) with its entry in
# CHANGELOG.md, built from a commit (no uncommitted change); builds
# $(BIN)/paysvc, checks that it reports VERSION, then the image
# $(IMAGE):$(VERSION) with the same version and revision (its OCI labels).
# IMAGE=registry.example.com/paysvc names the repository; DOCKER=echo
# prints the image's build command instead of running it.
release:
	@echo '$(VERSION)' | grep -Eqx '[0-9]+\.[0-9]+\.[0-9]+(-rc\.[0-9]+)?' || \
		{ echo "release: VERSION is $(VERSION), not a release: set it to X.Y.Z and give it its CHANGELOG.md entry" >&2; exit 1; }
	@grep -Eq '^## \[$(subst .,\.,$(VERSION))\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$$' CHANGELOG.md || \
		{ echo "release: CHANGELOG.md has no entry '## [$(VERSION)] - YYYY-MM-DD'" >&2; exit 1; }
	@case '$(REVISION)' in ''|*-dirty) echo "release: the revision is '$(REVISION)': release a commit, with no uncommitted change" >&2; exit 1;; esac
	@$(MAKE) --no-print-directory build
	@$(BIN)/paysvc version | grep -q '^paysvc $(VERSION) revision ' || \
		{ echo "release: $(BIN)/paysvc reports '$$($(BIN)/paysvc version)', not $(VERSION)" >&2; exit 1; }
	$(DOCKER) build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE):$(VERSION) .
	@echo "release $(VERSION) (revision $(REVISION)): $(BIN)/paysvc, image $(IMAGE):$(VERSION)"

# Make sure MariaDB, Redis and RabbitMQ run on loopback (install and start them if missing).
services:
	scripts/ensure-services.sh

test-tools:
	scripts/ensure-test-tools.sh

# Both modules: the service's (.) and the tools' (tools/: paybench, paychaos,
# k8scheck, which builds the Kubernetes overlays with kustomize, browsertest,
# which drives the admin pages in Chromium).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags faultinject ./...
	cd tools && $(GO) vet ./... && $(GO) vet -tags faultinject ./...

# The configuration reference (docs/configuration.md, and README.md between
# its config-reference markers) from the declarations in
# cmd/paysvc/config_keys.go, deploy/k8s/base/config.yaml (the ConfigMap
# kustomize generates) from config.yaml, and the prometheus-operator
# component's PrometheusRules from deploy/prometheus/*.yaml.
.PHONY: docs
docs:
	$(GO) test -count=1 -run '^TestConfigReferenceUpToDate$$' ./cmd/paysvc -args -update
	$(GO) test -count=1 -run '^TestPrometheusRulesUpToDate$$' ./deploy -args -update

# Unit and integration tests against the real servers (never skipped).
test: services test-tools lint rules
	scripts/leftovers.sh snapshot tmp/leftovers.before
	$(GO) test $(TESTFLAGS) ./...
	cd tools && $(GO) test $(TESTFLAGS) ./...
	scripts/leftovers.sh check tmp/leftovers.before

# The MySQL-facing tests and one fault scenario (TIDB_CHAOS) against TiDB:
# a tidb-server of its own on loopback (built once from the Go module proxy,
# about 5 minutes of both cores, and kept), unistore storage. Not in CI;
# what differs there: docs/deployment.md, "TiDB".
test-tidb: services test-tools
	scripts/test-tidb.sh

# The Kubernetes manifests (deploy/k8s: every overlay, the production
# overlay with each component) against a real kube-apiserver: server-side
# apply, dry run, strict field validation, in a namespace enforcing Pod
# Security "restricted"; any error or warning fails, and mutated copies
# must be refused. An etcd and a kube-apiserver of their own on loopback,
# built once from the Go module proxy and kept (~/.cache/paysvc-k8s): the
# first build about 10 CPU-minutes (19 minutes on this shared 2-core
# machine), 2.9 GB of memory at its peak, 3 GB of Go build cache; a
# rebuild with that cache 13 s. A run with them built: about 5 s, 400 MB.
# In CI (.ci/run), after make test; docs/testing.md.
test-k8s:
	scripts/test-k8s.sh

# The alert rules: syntax, and promtool's unit tests (every rule fires on the
# series it should; deploy/prometheus/*_test.yaml).
rules: test-tools
	P=$$(command -v promtool || echo $(CURDIR)/tmp/tools/promtool) && \
	$$P check rules deploy/prometheus/alerts.yaml deploy/prometheus/reconcile-alerts.yaml deploy/prometheus/opt-in-alerts.yaml && \
	cd deploy/prometheus && $$P test rules alerts_test.yaml reconcile-alerts_test.yaml opt-in-alerts_test.yaml

demo: services
	scripts/demo.sh

# The fault-injection suite: 3 real paysvc instances per scenario, faults
# injected, money invariants checked. A few minutes. Last line: N passed, M failed.
chaos: services
	$(GO) build -tags faultinject -o bin/paysvc-faultinject ./cmd/paysvc
	cd tools && $(GO) build -o ../bin/paychaos ./paychaos
	scripts/leftovers.sh snapshot tmp/leftovers.chaos
	bin/paychaos -binary bin/paysvc-faultinject $(if $(SEED),-seed $(SEED))
	scripts/leftovers.sh check tmp/leftovers.chaos

# The cluster suite: a 3-node RabbitMQ cluster, Redis with a replica and
# three Sentinels, a MariaDB of its own and a 3-node Galera cluster behind
# HAProxy, on loopback ports of their own (the shared servers are left
# alone), 3 paysvc instances given every node, node and master failures,
# a failover to an asynchronous MariaDB replica that lost acked payments.
# About 6 minutes here; needs root.
chaos-cluster: services
	scripts/ensure-galera.sh
	$(GO) build -tags faultinject -o bin/paysvc-faultinject ./cmd/paysvc
	cd tools && $(GO) build -o ../bin/paychaos ./paychaos
	scripts/leftovers.sh snapshot tmp/leftovers.cluster
	bin/paychaos -cluster -binary bin/paysvc-faultinject $(if $(SEED),-seed $(SEED))
	scripts/leftovers.sh check tmp/leftovers.cluster

# A seeded random mix of every fault: make soak SEED=42 DURATION=10m
SEED ?=
DURATION ?= 10m
soak: services
	$(GO) build -tags faultinject -o bin/paysvc-faultinject ./cmd/paysvc
	cd tools && $(GO) build -o ../bin/paychaos ./paychaos
	bin/paychaos -soak -binary bin/paysvc-faultinject -duration $(DURATION) $(if $(SEED),-seed $(SEED))

clean:
	rm -rf bin tmp

# Throughput and latency against the real servers, with the ceilings measured
# in the same run (a benchmark, not a test). Figures in docs/benchmarks.md.
BENCHFLAGS ?= -n 20000 -rounds 5
# make bench BENCH_TRACE=off,0.01,1 measures tracing's cost instead: the
# daemon's CPU per 1,000 payments (its process's rusage) with tracing off
# and at each sample ratio, spans to a local receiver that discards them,
# BENCH_TRACE_N payments a run, BENCH_TRACE_ROUNDS rounds; then the
# tracing work of one message alone (a Go benchmark, the process's CPU).
BENCH_TRACE ?=
BENCH_TRACE_N ?= 4000
BENCH_TRACE_ROUNDS ?= 3
bench: services
	$(GO) build -o bin/paysvc ./cmd/paysvc
	cd tools && $(GO) build -o ../bin/paybench ./paybench
ifneq ($(BENCH_TRACE),)
	bin/paybench -only trace -trace $(BENCH_TRACE) -n $(BENCH_TRACE_N) -rounds $(BENCH_TRACE_ROUNDS)
	$(GO) test -run XXX -bench MessageSpans -benchtime 20000x -count 3 ./internal/tracing/
else
	bin/paybench $(BENCHFLAGS)
	$(GO) test -run XXX -bench . -benchmem ./internal/listener/ ./internal/money/ ./internal/tracing/
endif

# The production-size benchmark: paysvc and the reference consumer (per
# message and batched by 10) on a small database and on one of 11M orders,
# 1M accounts, 10M flows and notices, uniform and hot payments, interleaved
# (docs/benchmarks.md, "At production size"). The databases are seeded once
# (bulk: about 4 minutes and 6-7 GiB for the large one) and kept between
# runs; make bench-large-drop drops them.
BENCHLARGEFLAGS ?= -large-n 40000 -large-rounds 1
bench-large: services
	$(GO) build -o bin/paysvc ./cmd/paysvc
	cd tools && $(GO) build -o ../bin/paybench ./paybench
	bin/paybench -only large $(BENCHLARGEFLAGS)

bench-large-drop:
	cd tools && $(GO) build -o ../bin/paybench ./paybench
	bin/paybench -large-drop $(BENCHLARGEFLAGS)
