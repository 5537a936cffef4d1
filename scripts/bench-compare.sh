#!/usr/bin/env bash
# bench-compare.sh OLD NEW [BENCH] [COUNT] [BENCHTIME]
# Builds the bench/ test binaries of two revisions, runs them interleaved
# (old, new, old, new, ...) so that machine noise hits both alike, and
# prints benchstat's comparison of the two.
set -euo pipefail
old=$1 new=$2 bench=${3:-.} count=${4:-10} benchtime=${5:-100ms}
top=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
cleanup() {
  for n in old new; do git -C "$top" worktree remove --force "$tmp/$n" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
for n in old new; do
  rev=${!n}
  git -C "$top" worktree add --quiet --detach "$tmp/$n" "$rev"
  (cd "$tmp/$n" && go test -c -o "$tmp/$n.test" ./bench)
  echo "built $n = $rev ($(git -C "$top" rev-parse --short "$rev"))" >&2
done
for i in $(seq "$count"); do
  for n in old new; do
    echo "run $i/$count: $n" >&2
    (cd "$tmp/$n/bench" && "$tmp/$n.test" -test.run '^$' -test.bench "$bench" -test.benchmem \
      -test.count 1 -test.benchtime "$benchtime") >> "$tmp/$n.txt"
  done
done
cd "$top"
go tool benchstat "old=$tmp/old.txt" "new=$tmp/new.txt"
