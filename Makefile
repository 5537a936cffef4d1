# kvradix: make test (the test command), make loadgen (the main job).
GO       ?= go
PKGS     := ./...
COUNT    ?= 10
BENCH    ?= .
BENCHTIME ?= 100ms
FUZZTIME ?= 10s
RESULTS  := results

.PHONY: test lint fuzz bench benchstat bench-compare targets loadgen replay replay-sweep replay-tiers replay-approx plots

test:
	$(GO) vet $(PKGS)
	$(GO) test -race -timeout 20m $(PKGS)

# staticcheck is fetched through the module proxy (not a dependency of the module).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt wants to rewrite: $$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) mod tidy -diff
	$(GO) run $(STATICCHECK) $(PKGS)

# A short run of every fuzz target, one at a time (go test -fuzz takes one);
# see scripts/fuzz.sh for the one retry it allows.
fuzz:
	GO=$(GO) ./scripts/fuzz.sh $(FUZZTIME) $(PKGS)

# The cross-package suite at -cpu 2, -count=$(COUNT), raw output into
# results/bench.txt; the concurrent workloads run again at -cpu 1. One -cpu
# value a process: the testing package makes a benchmark's first call at
# the list's last value (golang/go#49980).
BENCHCMD = $(GO) test -run '^$$' -benchmem -count $(COUNT) -benchtime $(BENCHTIME)
bench:
	@mkdir -p $(RESULTS)
	{ echo "# $$($(GO) version); $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $$(nproc) cores; commit $$(git rev-parse --short HEAD)"; \
	  echo "# $(BENCHCMD) -bench '$(BENCH)' -cpu 2 ./bench/"; \
	  echo "# $(BENCHCMD) -bench 'Mixed|Parallel' -cpu 1 ./bench/"; \
	  $(BENCHCMD) -bench '$(BENCH)' -cpu 2 ./bench/ && \
	  $(BENCHCMD) -bench 'Mixed|Parallel' -cpu 1 ./bench/ ; } | tee $(RESULTS)/bench.txt

# Each family against its baseline: raw XXH3 for hashing, the single-threaded
# tree for indexes, the single-threaded indexer for indexers.
benchstat:
	{ echo "## hashing: LocalHashes against raw XXH3 over the same bytes"; \
	  $(GO) tool benchstat -filter '.name:Hashing' -col /impl $(RESULTS)/bench.txt; \
	  echo; echo "## indexes: ConcurrentTree against the baseline Tree"; \
	  $(GO) tool benchstat -filter '.name:(Apply OR FindMatches OR FindMatchesParallel OR Trace)' -col /impl $(RESULTS)/bench.txt; \
	  echo; echo "## indexers: Pool against the single-threaded indexer, mixed reads and writes"; \
	  $(GO) tool benchstat -filter '.name:Mixed' -col /impl,/lanes $(RESULTS)/bench.txt; \
	  echo; echo "## scheduling and parallel writes"; \
	  $(GO) tool benchstat -filter '.name:(Schedule OR ApplyParallel)' $(RESULTS)/bench.txt; } | tee $(RESULTS)/benchstat.txt

# make bench-compare OLD=<rev> NEW=<rev>: interleaved runs of both revisions.
bench-compare:
	@test -n "$(OLD)" -a -n "$(NEW)" || { echo "usage: make bench-compare OLD=<rev> NEW=<rev>"; exit 2; }
	./scripts/bench-compare.sh "$(OLD)" "$(NEW)" "$(BENCH)" "$(COUNT)" "$(BENCHTIME)"

# The index's targets (store, writers, memory, lookups, removals, the
# field's benchmark per lane CPU-second), ROUNDS interleaved rounds of one
# to two minutes each, and a table of their medians against the targets;
# SUSTAINED=1 adds the field's sustained search (a few minutes).
targets:
	./scripts/targets.sh $(RESULTS)/targets.txt

# The reference's drain-correct protocol on the embedded trace, every
# indexer: the shortest window each keeps up with (about a minute).
loadgen:
	$(GO) run ./cmd/loadgen indexer -sweep -duration 4s -sweep-steps 7

replay:
	$(GO) run ./cmd/loadgen replay

# The KV router's policy frontier on the embedded trace (about 35 s
# on 2 cores): table and JSON into results/.
SWEEP ?= -sweep overlap_weight=0,0.5,1,2,4,8,16,32,64 -sweep temperature=0,0.02,0.1
HOSTLINE = echo "\# $$($(GO) version); $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $$(nproc) cores; commit $$(git rev-parse --short HEAD)"
replay-sweep:
	{ echo "# go run ./cmd/loadgen replay $(SWEEP)"; $(HOSTLINE); $(GO) run ./cmd/loadgen replay $(SWEEP); } | tee $(RESULTS)/replay-sweep.txt
	{ echo "# go run ./cmd/loadgen replay -json $(SWEEP)"; $(HOSTLINE); $(GO) run ./cmd/loadgen replay -json $(SWEEP); } > $(RESULTS)/replay-sweep.json

# Tier-aware routing on the embedded trace with a host tier of 4x each
# engine's device blocks (about a minute on 2 cores): kv against kv_tiers,
# then kv_tiers' host weight swept; table and JSON into results/.
TIERS ?= -offload 4 -sweep host_weight=0,0.2,0.4,0.6,0.8,1
replay-tiers:
	{ echo "# go run ./cmd/loadgen replay -offload 4 -routers round_robin,kv,kv_tiers"; $(HOSTLINE); $(GO) run ./cmd/loadgen replay -offload 4 -routers round_robin,kv,kv_tiers; \
	  echo; echo "# go run ./cmd/loadgen replay $(TIERS)"; $(GO) run ./cmd/loadgen replay $(TIERS); } | tee $(RESULTS)/replay-tiers.txt
	{ echo "# go run ./cmd/loadgen replay -json $(TIERS)"; $(HOSTLINE); $(GO) run ./cmd/loadgen replay -json $(TIERS); } > $(RESULTS)/replay-tiers.json

# Routing without events on the embedded trace (about 5 minutes on 2
# cores): kv against the approximate routers and kv_predict; their
# accuracy as kv_approx_lru's capacity (x the engines' true blocks, at the
# default pool and at a pressed one) and kv_approx_ttl's lifetime vary;
# kv_predict on bursts; router replicas sharing their admissions or not.
# Tables and JSON into results/.
APPROX_ROUTERS = -routers kv,kv_approx_lru,kv_approx_ttl,kv_predict
APPROX_CAP ?= -sweep approx_capacity=0.25,0.5,1,2,4
APPROX_TTL ?= -sweep approx_ttl=30,120,300,600,1200,3600
replay-approx:
	{ echo "# go run ./cmd/loadgen replay $(APPROX_ROUTERS)"; $(HOSTLINE); $(GO) run ./cmd/loadgen replay $(APPROX_ROUTERS); \
	  for b in 16384 2048; do echo; echo "# go run ./cmd/loadgen replay -blocks $$b $(APPROX_CAP)"; $(GO) run ./cmd/loadgen replay -blocks $$b $(APPROX_CAP); done; \
	  echo; echo "# go run ./cmd/loadgen replay $(APPROX_TTL)"; $(GO) run ./cmd/loadgen replay $(APPROX_TTL); \
	  for r in 4 8 12; do echo; echo "# go run ./cmd/loadgen replay -burst -burst-rate $$r -routers kv,kv_predict,kv_approx_lru"; $(GO) run ./cmd/loadgen replay -burst -burst-rate $$r -routers kv,kv_predict,kv_approx_lru; done; } | tee $(RESULTS)/replay-approx.txt
	{ echo "# go run ./cmd/loadgen replay -json -blocks 2048 $(APPROX_CAP)"; $(HOSTLINE); $(GO) run ./cmd/loadgen replay -json -blocks 2048 $(APPROX_CAP); } > $(RESULTS)/replay-approx-capacity.json
	{ echo "# go run ./cmd/loadgen replay -json $(APPROX_TTL)"; $(HOSTLINE); $(GO) run ./cmd/loadgen replay -json $(APPROX_TTL); } > $(RESULTS)/replay-approx-ttl.json
	{ echo "# go run ./cmd/loadgen replay -replicas N [-isolated] -routers kv,kv_approx_lru,kv_approx_ttl (N = 2, 4)"; $(HOSTLINE); \
	  for n in 2 4; do for iso in false true; do echo; $(GO) run ./cmd/loadgen replay -replicas $$n -isolated=$$iso -routers kv,kv_approx_lru,kv_approx_ttl; done; done; } | tee $(RESULTS)/replay-approx-replicas.txt

# Every SVG plot in results/, from the results files alone.
plots:
	$(GO) run ./cmd/plots -results $(RESULTS)
