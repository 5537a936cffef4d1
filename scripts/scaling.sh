#!/usr/bin/env bash
# Concurrency scaling of the indexes and indexers at -cpu=1,2,4,8,16, and
# of the field's benchmark by pool lanes.
# Usage: scripts/scaling.sh [OUTFILE]. Writes OUTFILE (default
# results/scaling.txt) and, beside it, OUTFILE's name with -lanes: the
# compressed pool on the trace at -dup 2 -length-factor 4 with
# -lanes 1,2,4,8, 3 fresh processes each, at two windows.
# Runs a prebuilt bench.test if BENCH_BIN is set and a prebuilt loadgen if
# LOADGEN_BIN is (for machines without Go), else builds them. With
# PROFILES=DIR it also writes to DIR where the writers wait and spend at
# the last -cpu value: block, mutex and CPU profiles of
# BenchmarkParallelStore and BenchmarkApplyParallel on the CompressedTree
# (read them with go tool pprof -top BENCH_BIN FILE).
#
# Each -cpu value runs in a process of its own: the testing package makes
# a benchmark's first call at the -cpu list's last value (golang/go#49980),
# which for a b.Loop benchmark is its whole figure. BenchmarkParallelStore
# runs at -benchtime 2x: one iteration stores the whole trace, and a
# shorter -benchtime keeps only the process's first store, into a cold heap.
set -euo pipefail
out=${1:-results/scaling.txt}
lanesout=${out%.txt}-lanes.txt
. "$(dirname "$0")/binaries.sh"
cpus=${CPUS:-1 2 4 8 16}
{
  echo "# kvradix concurrency scaling"
  header
  echo "# cmd: for c in $cpus: bench.test -test.run '^\$' -test.bench 'Mixed|FindMatchesParallel|ApplyParallel' -test.benchmem -test.cpu \$c -test.count ${COUNT:-3} -test.benchtime 200ms"
  echo "#      then bench.test -test.run '^\$' -test.bench ParallelStore -test.benchmem -test.cpu \$c -test.count ${STORE_COUNT:-2} -test.benchtime 2x"
  cd bench
  for c in $cpus; do
    "$bin" -test.run '^$' -test.bench 'Mixed|FindMatchesParallel|ApplyParallel' -test.benchmem \
      -test.cpu "$c" -test.count "${COUNT:-3}" -test.benchtime 200ms
  done
  for c in $cpus; do
    "$bin" -test.run '^$' -test.bench 'ParallelStore' -test.benchmem \
      -test.cpu "$c" -test.count "${STORE_COUNT:-2}" -test.benchtime 2x
  done
  cd ..
} | tee "$out"
if [ -n "${PROFILES:-}" ]; then
  mkdir -p "$PROFILES"
  dir=$(cd "$PROFILES" && pwd)
  top=${cpus##* }
  (
    cd bench
    "$bin" -test.run '^$' -test.bench 'ParallelStore/impl=compressed$' -test.cpu "$top" -test.benchtime 2x \
      -test.blockprofile "$dir/parallelstore.block" -test.mutexprofile "$dir/parallelstore.mutex" -test.mutexprofilefraction 5 \
      -test.cpuprofile "$dir/parallelstore.cpu"
    "$bin" -test.run '^$' -test.bench 'ApplyParallel/impl=compressed' -test.cpu "$top" -test.benchtime 1s \
      -test.blockprofile "$dir/applyparallel.block" -test.mutexprofile "$dir/applyparallel.mutex" -test.mutexprofilefraction 5 \
      -test.cpuprofile "$dir/applyparallel.cpu"
  ) | tee "$dir/profiled.txt"
fi
{
  echo "# the field's benchmark by pool lanes"
  header
  for w in 1.5s 0.5s; do
    echo "# cmd: loadgen indexer -compare compressed -dup 2 -length-factor 4 -quiet -duration $w -lanes 1,2,4,8 -repeat 3"
    "$lg" indexer -compare compressed -dup 2 -length-factor 4 -quiet -duration "$w" -lanes 1,2,4,8 -repeat 3
  done
} 2>&1 | tee "$lanesout"
