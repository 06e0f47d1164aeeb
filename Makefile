# outbox-relay. `make test` is what CI runs (.ci/run): it installs what is missing, assembles the
# Kafka broker from Maven Central, and runs every test against real PostgreSQL and Kafka.
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
TEST_TIMEOUT ?= 20m

# Local services (see internal/devenv): PostgreSQL with wal_level=logical and a KRaft Kafka broker.
# `make up` writes their addresses to $(LOCAL)/services.env.
LOCAL ?= .local
DEVENV := go run ./internal/cmd/devenv

.PHONY: tools kafka-lib up down services-status build test lint

tools:
	@bash scripts/ensure-tools.sh

kafka-lib: tools
	@bash scripts/kafka-lib.sh

up: tools kafka-lib
	@$(DEVENV) up --dir $(LOCAL)

down:
	@$(DEVENV) down --dir $(LOCAL)

services-status:
	@$(DEVENV) status --dir $(LOCAL)

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/outbox-relay ./cmd/outbox-relay

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Integration tests start their own PostgreSQL clusters and Kafka brokers (internal/testenv).
test: tools kafka-lib lint
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
