# outbox-relay. `make test` is what CI runs (.ci/run): it installs what is missing, assembles the
# Kafka broker and the schema registry from Maven Central, and runs every test against real
# PostgreSQL, Kafka and schema registry.
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The commit and its time, stamped for `outbox-relay version` where Go's own build information has
# none (a git worktree, an image built without .git).
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
COMMIT_TIME ?= $(shell TZ=UTC git log -1 --format=%cd --date=iso-strict-local 2>/dev/null)
# The one build of the binary: make build, make release and deploy/Dockerfile (deploy/deploy_test.go
# checks that the Dockerfile's is this one). Static (CGO_ENABLED=0), no local paths (-trimpath).
GO_BUILD = CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.commitTime=$(COMMIT_TIME)"
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
TEST_TIMEOUT ?= 20m

# Local services (see internal/devenv): PostgreSQL with wal_level=logical and a KRaft Kafka broker.
# `make up` writes their addresses to $(LOCAL)/services.env. PG_VERSION (14 to 18) picks the
# PostgreSQL major version of a new cluster; the newest (18) when empty.
LOCAL ?= .local
PG_VERSION ?=
DEVENV := go run ./internal/cmd/devenv

.PHONY: tools test-tools kafka-lib pg-lib registry-lib up down services-status build test lint

# What the local services need (PostgreSQL, Java, Maven): make up and make demo install no more.
tools:
	@bash scripts/ensure-tools.sh

# And the test tools: promtool (deploy/'s alert rule checks) and PgBouncer (the leader lock through a
# pooler).
test-tools:
	@bash scripts/ensure-tools.sh test

kafka-lib: tools
	@bash scripts/kafka-lib.sh

# PostgreSQL 14, 16, 17 and 18 server binaries from Maven Central (15 is Debian's): scripts/pg-lib.sh.
pg-lib: tools
	@bash scripts/pg-lib.sh >/dev/null

# The schema registry the registry-backed encodings are tested against: Apicurio Registry from
# Maven Central (scripts/registry-lib.sh), its Confluent-compatible API at /apis/ccompat/v7.
registry-lib: tools
	@bash scripts/registry-lib.sh >/dev/null

# REGISTRY=1 also runs a schema registry (for value_encoding avro, protobuf, json-schema) and
# adds OUTBOX_SCHEMA_REGISTRY_URLS to services.env.
up: tools kafka-lib pg-lib $(if $(REGISTRY),registry-lib)
	@$(DEVENV) up --dir $(LOCAL) $(if $(PG_VERSION),--pg-version $(PG_VERSION)) $(if $(REGISTRY),--registry)

down:
	@$(DEVENV) down --dir $(LOCAL)

services-status:
	@$(DEVENV) status --dir $(LOCAL)

build:
	$(GO_BUILD) -o bin/outbox-relay ./cmd/outbox-relay

# The downloads: a static binary per platform, dist/outbox-relay-VERSION-OS-ARCH, and their SHA-256
# checksums in dist/SHA256SUMS (sha256sum -c SHA256SUMS checks them).
.PHONY: release
release:
	@rm -rf dist && mkdir -p dist
	@set -e; for p in $(RELEASE_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; out=dist/outbox-relay-$(VERSION)-$$os-$$arch; \
	  echo "$$out"; GOOS=$$os GOARCH=$$arch $(GO_BUILD) -o $$out ./cmd/outbox-relay; \
	done
	@cd dist && sha256sum outbox-relay-* > SHA256SUMS && cat SHA256SUMS

# docs/configuration.md from the configuration keys (config/keys.go); internal/configdoc's test
# fails when the page and the keys disagree.
.PHONY: docs
docs:
	$(GO) run ./internal/cmd/configdoc -o docs/configuration.md

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Integration tests start their own PostgreSQL clusters and Kafka brokers (internal/testenv).
# Three test packages at once on two cores: the packages wait on servers much of the time, so a
# third keeps the cores busier (91% against 70%) and the suite shorter (docs/development.md, "How
# long make test takes"); the tests wait for facts (a commit position, a log line, a metric), not
# for time, so the contention slows them without failing them. go test starts the packages' runs
# in the order listed: the longest first, so that no long one is left to run alone at the end.
# ./... adds the others once.
TEST_PACKAGES_AT_ONCE ?= 3
TEST_LONGEST_FIRST := ./cmd/outbox-relay ./faults ./sink ./relay ./internal/chaos ./replication \
	./internal/chaos/cluster ./leader ./poll ./bench ./internal/chaos/workload ./inbox ./internal/devenv
test: test-tools kafka-lib pg-lib registry-lib lint
	$(GO) test -race -count=1 -p $(TEST_PACKAGES_AT_ONCE) -timeout $(TEST_TIMEOUT) $(TEST_LONGEST_FIRST) ./...

# The fault suite alone (faults/, also part of `make test`): kill -9, broker and PostgreSQL outages,
# stalled connections, failure policies, bounded memory, lost slots (docs/guarantees.md).
# OUTBOX_FAULTS_BIG_TX_ROWS=1000000 runs the memory scenario at the issue's full size.
.PHONY: test-faults
test-faults: tools kafka-lib pg-lib
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -v ./faults/

# The nemesis (internal/chaos, docs/guarantees.md "The nemesis"): every mode side by side on a
# PostgreSQL primary with a standby, one Kafka broker (BROKERS=3: three, replicated) and three
# relays per mode, under overlapping faults drawn from SEED for DURATION; it checks the history and
# writes an HTML report per mode under .local/chaos/. SEED=42 DURATION=30m MODE=eo-table,alo-messages
# make chaos; KINDS narrows the fault kinds; RELAYS, WRITERS, RATE, MEAN, SHORT, BROKERS shape the
# load, the servers and the schedule. Exit 1 when
# a rule was broken or a requirement missed; the run prints the command that draws the same
# schedule, and REPLAY=<dir>/<mode>/history.json MODE=<mode> runs one mode's schedule again.
.PHONY: chaos
chaos: tools kafka-lib pg-lib
	SEED='$(SEED)' DURATION='$(DURATION)' MODE='$(MODE)' KINDS='$(KINDS)' PG_VERSION='$(PG_VERSION)' DRAIN='$(DRAIN)' \
	RELAYS='$(RELAYS)' WRITERS='$(WRITERS)' RATE='$(RATE)' MEAN='$(MEAN)' SHORT='$(SHORT)' REPLAY='$(REPLAY)' BROKERS='$(BROKERS)' $(GO) run ./internal/cmd/chaos

# The relay's records against Debezium's own (Kafka Connect with the PostgreSQL connector and the
# outbox event router, jars from bench/debezium-lib.sh) for the router options it supports
# (cmd/outbox-relay/debezium_router_test.go, build tag debezium), and its Avro records against
# those of Apicurio's AvroConverter through the schema registry (debezium_avro_test.go): two JVM
# starts and a few minutes.
.PHONY: test-debezium
test-debezium: tools kafka-lib pg-lib registry-lib
	@bash bench/debezium-lib.sh >/dev/null
	$(GO) test -tags debezium -count=1 -timeout $(TEST_TIMEOUT) -v -run 'Debezium' ./cmd/outbox-relay/

# The outbox end to end on local services: make up, migrate, relay, orders in, events out, where to
# look next (the metrics, outbox-relay status), make down. It installs only what it runs (make up's
# tools: PostgreSQL, Java and Maven for Kafka), never the test tools (internal/devenv's
# TestTheDemoInstallsOnlyWhatItRuns). PG_VERSION=15 make demo runs it on another PostgreSQL major
# version (make up's knob); DEMO_METRICS_ADDR (127.0.0.1:9187) is where the relay serves /metrics.
.PHONY: demo
demo:
	@LOCAL=$(LOCAL) bash scripts/demo.sh

# Side-by-side benchmark (bench/, results in docs/benchmarks.md): the relay against the
# pg_recvlogical ceiling and Debezium on Kafka Connect, which bench/debezium-lib.sh fetches through
# Maven. Not part of `make test` (bench/ has a smoke test that is). BENCH_EVENTS=100000 for a
# shorter run; BENCH_SWEEP=on measures the relay's steady state at several kafka.linger /
# transaction_interval settings and draws the curves too; the other BENCH_* knobs are listed by
# `go run ./bench -h`. The run writes its charts (drains, latency, sweep; .svg and .png) and its
# report, results.md (the tables with the run's commit, machine and settings), to BENCH_CHARTS
# ($(LOCAL)/bench). `make bench-docs` is the run behind docs/benchmarks.md: the same with the sweep,
# into docs/bench (BENCH_CHARTS=docs/bench BENCH_SWEEP=on make bench).
.PHONY: bench
bench: tools kafka-lib registry-lib build
	@bash bench/debezium-lib.sh >/dev/null
	@$(GO) run ./bench --relay-bin bin/outbox-relay --charts "$${BENCH_CHARTS:-$(LOCAL)/bench}"

.PHONY: bench-docs
bench-docs:
	@BENCH_CHARTS=docs/bench BENCH_SWEEP="$${BENCH_SWEEP:-on}" $(MAKE) --no-print-directory bench
