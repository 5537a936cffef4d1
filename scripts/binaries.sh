# scripts/binaries.sh, sourced by the measuring scripts: bin is the bench/
# test binary and lg loadgen, prebuilt where BENCH_BIN and LOADGEN_BIN name
# them (for machines without Go), else built now into a temporary folder;
# header prints the lines a results file starts with (COMMIT overrides the
# checkout's, where the binaries were built elsewhere).
# Both are made absolute: the scripts run bench.test from bench/.
abs() { case $1 in /* | "") echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
bin=$(abs "${BENCH_BIN:-}")
lg=$(abs "${LOADGEN_BIN:-}")
if [ -z "$bin" ]; then
  bin=$(mktemp -d)/bench.test
  go test -c -o "$bin" ./bench
fi
if [ -z "$lg" ]; then
  lg=$(mktemp -d)/loadgen
  go build -o "$lg" ./cmd/loadgen
fi
header() {
  echo "# commit: ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo "# $(go version 2>/dev/null || echo "go: prebuilt binaries")"
  echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc)"
}
