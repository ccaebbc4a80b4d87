SHELL := /bin/bash
GO ?= go
STATICCHECK ?= $(shell $(GO) env GOPATH)/bin/staticcheck

# The repository holds several modules (the library at the root; the CLI,
# examples, benchmarks, fault suite, Kafka key source, Prometheus metrics,
# migration tests and the project's tools each in a go.mod of their own),
# joined by go.work.
# In workspace mode ./... covers only the module of the current directory,
# so every target names each module's tree: MODULES are the workspace's
# module directories, PKGS their package patterns (./... ./bench/... …),
# and one go command builds and tests them all, in parallel as before.
MODULES := $(patsubst $(CURDIR)%,.%,$(shell $(GO) list -m -f '{{.Dir}}'))
PKGS := $(addsuffix /...,$(MODULES))

# The newest Go release CI also tests the library with (the go directive
# stays at the oldest supported one); the go command downloads it.
GO_NEWEST ?= go1.27.0

.PHONY: test test-short test-newest lint tidy api api-check bench chaos chaos-ci chaos-surfaces

# The one test command: every package of every module against the real
# services, with the race detector. CI runs it through .ci/run. The run
# goes through tools/testsummary, which prints what go test prints and
# ends with a line naming the services that were down and the number of
# skipped tests.
SUMMARY = $(GO) run ./tools/testsummary
test:
	$(GO) vet $(PKGS)
	@set -o pipefail; $(GO) test -json -race -count=1 -timeout 9m $(PKGS) 2>&1 | $(SUMMARY)

# The inner loop: every package without the race detector, skipping the
# long tests that check testing.Short() (100k-row janitor cleanups, the
# relay's and the version guard's volume runs, the end-to-end broker
# scenarios, the Redis Cluster failover kills). make test stays the full run.
test-short:
	@set -o pipefail; $(GO) test -json -short -count=1 -timeout 5m $(PKGS) 2>&1 | $(SUMMARY)

# The library module with the newest Go release: its vet and the short
# tests, without the race detector (make test is the full run, on the
# release the go directive names).
test-newest:
	GOTOOLCHAIN=$(GO_NEWEST) $(GO) vet ./...
	GOTOOLCHAIN=$(GO_NEWEST) $(GO) test -short -count=1 -timeout 5m ./...

# Fails when any module's go.mod or go.sum is not what `go mod tidy`
# (which ignores go.work) would write.
tidy:
	@status=0; for m in $(MODULES); do \
	  (cd $$m && $(GO) mod tidy -diff) || { echo "$$m: go.mod/go.sum are not tidy: run 'go mod tidy' there and commit the result"; status=1; }; \
	done; exit $$status

# The exported API of the library module's public packages, one line per
# feature in the format of Go's api/go1.*.txt files (tools/apifile). A PR
# that changes the API changes this file, so the change is reviewed;
# api-check (in lint and CI) fails when the file is stale.
API_FILE = api/watermill-idempotent.txt
APIFILE = $(GO) run ./tools/apifile
api:
	$(APIFILE) -o $(API_FILE)

api-check:
	@$(APIFILE) -check $(API_FILE) || { echo "$(API_FILE) is stale: run 'make api' and commit the result"; exit 1; }

lint: tidy api-check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@latest
	$(STATICCHECK) $(PKGS)

# Go benchmarks (per backend: repotest.Bench; the middleware), then the
# comparison harness (go run ./bench; see docs/benchmarks.md). Needs the
# local PostgreSQL; MariaDB, Redis and pgbench are used when present.
# A failing Go benchmark does not stop the harness; make still fails.
bench:
	@status=0; \
	$(GO) test -run '^$$' -bench . -benchmem -timeout 9m $(PKGS) || status=$$?; \
	$(GO) run ./bench || status=$$?; \
	exit $$status

# The fault suite (chaos/, a module; results in docs/reliability.md):
# worker processes competing on RabbitMQ, SIGKILLs and exits between
# commit and ack, a private PostgreSQL cluster (port 5437, created on
# first use with pg_createcluster, which needs root or the postgres user)
# restarted and cut off mid-stream, the outbox relay and its LISTEN
# connection killed; a ledger counts doubled and lost effects. chaos is
# the full configuration (thousands of orders, minutes); chaos-ci the
# small one .ci/run runs, once in the default mode and once with group
# commit (batches of 8), then the surfaces configuration (once, httpidem
# and the partitioned inbox under the same faults, on a private cluster of
# its own, port 5450, about a minute), which chaos-surfaces runs alone,
# then the storm test (every backend of 72 database/sql callers
# terminated, port 5455) alone and without the race detector, which make
# test skips, and the Redis Cluster failovers with DurableWrites (about
# a minute), which make test skips under the race detector (go-redis races
# with itself there). The surfaces children open their pools as a user does
# (sql.Open): with a 0.67 s StoreTimeout, that their reconnects after a
# terminate or restart fault do not fill the cluster's accept queue and
# time out behind each other for minutes is the library's doing
# (sqlexec.Std; docs/operations.md). The PostgreSQL failover run (-config
# failover, 3-4 minutes, ports 5440-5441) and the reconnect-storm
# measurement (-config storm, about a minute, port 5455) are run by hand.
# chaos-ci ends with the robustness suite's short profile (-config robust,
# chaos/robustness, under two minutes): every store's history under faults
# checked against a model with porcupine, on private servers (PostgreSQL
# port 5460, Redis 6390-6391) and the suite's own MariaDB database;
# -config robust-full is the long profile (a minute per cell).
chaos:
	$(GO) run ./chaos/cmd/chaos -config full

chaos-ci:
	$(GO) run ./chaos/cmd/chaos -config ci
	$(GO) run ./chaos/cmd/chaos -config ci -batch 8
	$(GO) run ./chaos/cmd/chaos -config surfaces
	$(GO) test -count=1 -run '^TestStormComesBackOnDatabaseSQL$$' -v ./chaos
	$(GO) test -count=1 -run '^TestClusterFailoverLoss$$/\+durable$$' -v ./repository/redis
	$(GO) run ./chaos/cmd/chaos -config robust

chaos-surfaces:
	$(GO) run ./chaos/cmd/chaos -config surfaces
