#!/usr/bin/env bash
# Concurrency scaling of the indexes and indexers at -cpu=1,2,4,8,16.
# Usage: scripts/scaling.sh [OUTFILE]. Runs a prebuilt bench.test if
# BENCH_BIN is set (for machines without Go), else builds one. Each -cpu
# value runs in a process of its own: the testing package makes a
# benchmark's first call at the -cpu list's last value (golang/go#49980),
# which for a b.Loop benchmark is its whole figure.
set -euo pipefail
out=${1:-results/scaling.txt}
bin=${BENCH_BIN:-}
if [ -z "$bin" ]; then
  bin=$(mktemp -d)/bench.test
  go test -c -o "$bin" ./bench
fi
cpus=${CPUS:-1 2 4 8 16}
{
  echo "# kvradix concurrency scaling"
  echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "# $(go version 2>/dev/null || echo "go: prebuilt test binary")"
  echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc)"
  echo "# cmd: for c in $cpus: bench.test -test.run '^\$' -test.bench 'Mixed|Parallel' -test.benchmem -test.cpu \$c -test.count ${COUNT:-5} -test.benchtime ${BENCHTIME:-200ms}"
  cd bench
  for c in $cpus; do
    "$bin" -test.run '^$' -test.bench 'Mixed|Parallel' -test.benchmem \
      -test.cpu "$c" -test.count "${COUNT:-5}" -test.benchtime "${BENCHTIME:-200ms}"
  done
} | tee "$out"
