GO ?= go
STATICCHECK ?= $(shell $(GO) env GOPATH)/bin/staticcheck

.PHONY: test test-short lint tidy bench chaos chaos-ci

# The one test command: every package against the real services, with the
# race detector. CI runs it through .ci/run.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 9m ./...

# The inner loop: every package without the race detector, skipping the
# long tests that check testing.Short() (100k-row janitor cleanups, the
# relay's and the version guard's volume runs, the end-to-end broker
# scenarios, the Redis Cluster failover kills). make test stays the full run.
test-short:
	$(GO) test -short -count=1 -timeout 5m ./...

# Fails when go.mod or go.sum is not what `go mod tidy` would write.
tidy:
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit the result"; exit 1; }

lint: tidy
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@latest
	$(STATICCHECK) ./...

# Go benchmarks (per backend: repotest.Bench; the middleware), then the
# comparison harness (go run ./bench; see docs/benchmarks.md). Needs the
# local PostgreSQL; MariaDB, Redis and pgbench are used when present.
# A failing Go benchmark does not stop the harness; make still fails.
bench:
	@status=0; \
	$(GO) test -run '^$$' -bench . -benchmem -timeout 9m ./... || status=$$?; \
	$(GO) run ./bench || status=$$?; \
	exit $$status

# The fault suite (internal/chaos; results in docs/reliability.md): worker
# processes competing on RabbitMQ, SIGKILLs and exits between commit and
# ack, a private PostgreSQL cluster (port 5437, created on first use with
# pg_createcluster, which needs root or the postgres user) restarted and
# cut off mid-stream, the outbox relay and its LISTEN connection killed; a
# ledger counts doubled and lost effects. chaos is the full configuration
# (thousands of orders, minutes); chaos-ci the small one .ci/run runs,
# once in the default mode and once with group commit (batches of 8).
chaos:
	$(GO) run ./internal/chaos/cmd/chaos -config full

chaos-ci:
	$(GO) run ./internal/chaos/cmd/chaos -config ci
	$(GO) run ./internal/chaos/cmd/chaos -config ci -batch 8
