#!/usr/bin/env bash
# The index's targets (the CompressedTree's store, its writers, its memory,
# its lookups and removals, the field's benchmark per lane CPU-second),
# measured in one go: ROUNDS interleaved rounds, each running every figure
# once, then a table of their medians against the targets.
# Usage: scripts/targets.sh [OUTFILE]. Writes OUTFILE (default
# results/targets.txt): the raw benchmark lines (benchstat reads them) and
# the table. ROUNDS (default 6) sets the rounds. Runs a prebuilt bench.test
# if BENCH_BIN is set and a prebuilt loadgen if LOADGEN_BIN is, else builds
# them. A round takes one to two minutes on a 2-core machine. With
# SUSTAINED=1 it ends with the field's sustained search (loadgen indexer
# -sustained: each point 3 fresh processes, a few minutes), whose rate per
# lane CPU-second is the figure the field publishes.
#
# Every figure is at GOMAXPROCS 2 (a 2-core machine's), but ParallelStore's
# one writer at GOMAXPROCS 1. Every figure but the lookups and removals
# comes from a fresh process:
# FreshStore and FreshStoreSized run each store in a child of its own at
# GOMAXPROCS 2, one writer or two; ParallelStore runs at -cpu 1 and -cpu 2
# in processes of their own (golang/go#49980), at -benchtime 2x so that it
# measures warm stores; the field's benchmark is loadgen's fixed window
# (1.5 s, -sized, the scaled standard settings). A ratio of two writers to
# one is taken within a round, then its median over the rounds: on a
# shared virtual machine the hour moves both figures together. Each round
# also times raw XXH3 over 1,024 tokens, computation alone, so that a slow
# hour shows as one: 293-296 ns in results/bench.txt's.
set -euo pipefail
out=${1:-results/targets.txt}
rounds=${ROUNDS:-6}
. "$(dirname "$0")/binaries.sh"
sustained=(-compare compressed -lanes 2 -dup 2 -length-factor 4 -sized -duration 5s)
bench() { "$bin" -test.run '^$' -test.benchmem -test.cpu 2 "$@" | grep '^Benchmark'; }
round() {
  cd bench
  bench -test.bench 'Hashing/impl=raw/block=16/tokens=1024$' -test.benchtime 100ms
  bench -test.bench 'FreshStore' -test.benchtime 1x
  bench -test.bench 'ParallelStore/impl=compressed' -test.benchtime 2x -test.cpu 1
  bench -test.bench 'ParallelStore/impl=compressed' -test.benchtime 2x
  bench -test.bench 'Corpus/ops=events' -test.benchtime 2x
  bench -test.bench 'Shaped/op=lookup/impl=compressed$' -test.benchtime 12031x
  bench -test.bench 'SharedPrefix/impl=compressed' -test.benchtime 20000x
  bench -test.bench 'Tail/op=.*/impl=compressed'
  cd ..
  GOMAXPROCS=2 "$lg" indexer -compare compressed -dup 2 -length-factor 4 -sized -duration 1.5s -format bench -quiet | grep '^Benchmark'
}
{
  echo "# kvradix: the index's targets, interleaved rounds: $rounds"
  header
  echo "# cmd: scripts/targets.sh (see its header for each figure's command)"
  for r in $(seq "$rounds"); do
    echo "# round $r"
    round
  done
  if [ -n "${SUSTAINED:-}" ]; then
    echo "# GOMAXPROCS=2 loadgen indexer -sustained ${sustained[*]}"
    GOMAXPROCS=2 "$lg" indexer -sustained "${sustained[@]}" | grep '^sustained:'
  fi
} | tee "$out.raw"
"$(dirname "$0")/targets.awk" "$out.raw" | tee "$out.table"
cat "$out.raw" "$out.table" >"$out"
rm "$out.raw" "$out.table"
