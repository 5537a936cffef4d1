#!/bin/sh
# scripts/fuzz.sh FUZZTIME PKG...: every fuzz target of the packages, one at
# a time (go test -fuzz takes one), for FUZZTIME each.
#
# Go 1.26's fuzzing coordinator can fail a target at the -fuzztime deadline
# with a bare "context deadline exceeded" and no failing input, when its
# workers miss the stop on a loaded machine (go.dev/issue/75804, fixed in
# Go 1.27). A target that fails without writing a failing input into its
# testdata/fuzz/ is therefore run once more; a failing input written, or a
# second failure, fails the sweep.
#
# Each new interesting input is minimized for -fuzzminimizetime (60 s by
# default) while the target's fuzzing waits: a 60 s run of a radix target
# fuzzed for a few seconds and minimized for the rest (execs flat at 0/s
# from the 9th second). At 1 s (FUZZMINIMIZETIME to change it), 40 s of
# FuzzCompressedTree found 50 new interesting inputs instead of 6. A
# failing input is minimized for as long.
set -eu
go=${GO:-go}
fuzztime=$1
shift
minimize=${FUZZMINIMIZETIME:-1s}
inputs() { find "$1" -type f 2>/dev/null | wc -l; }
for pkg in $($go list "$@"); do
	dir=$($go list -f '{{.Dir}}' "$pkg")
	for f in $($go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		echo "== $pkg $f"
		before=$(inputs "$dir/testdata/fuzz/$f")
		if $go test -run '^$' -fuzz "^$f\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$pkg"; then
			continue
		fi
		if [ "$(inputs "$dir/testdata/fuzz/$f")" != "$before" ]; then
			echo "FAIL: $f wrote a failing input into $dir/testdata/fuzz/$f" >&2
			exit 1
		fi
		echo "== $pkg $f failed without a failing input (go.dev/issue/75804): once more"
		$go test -run '^$' -fuzz "^$f\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$pkg"
	done
done
