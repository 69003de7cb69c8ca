# paysvc: make demo (run it with demo traffic), make test (all tests).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
TESTFLAGS ?= -race -count=1 -timeout 15m

.PHONY: build services test-tools test lint demo clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/paysvc ./cmd/paysvc

# Make sure MariaDB, Redis and RabbitMQ run on loopback (install and start them if missing).
services:
	scripts/ensure-services.sh

test-tools:
	scripts/ensure-test-tools.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags faultinject ./...

# Unit and integration tests against the real servers (never skipped).
test: services test-tools lint
	$(GO) test $(TESTFLAGS) ./...

demo: services
	scripts/demo.sh

clean:
	rm -rf bin tmp
