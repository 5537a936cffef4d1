#!/usr/bin/awk -f
# scripts/targets.awk RAW: the table of scripts/targets.sh from its raw
# benchmark lines ("# round N" lines between rounds). Each figure is the
# median over the rounds; a ratio is taken within each round first.

/^# round / { round = $3; rounds = round; next }
/^sustained:/ {
	sustained = $0
	sub(/.*\(/, "", sustained)
	sub(/M per second.*/, "", sustained)
	next
}
/^Benchmark/ {
	for (i = 3; i <= NF; i++)
		if ($i !~ /^[0-9.e+-]+$/)
			v[$1 "|" $i "|" round] = $(i - 1)
}

# median of the figure of name in unit over the rounds ("" if none).
function median(name, unit) { return med(name, unit, "", "") }

# ratio: the median over the rounds of a's figure over b's (in unit).
function ratio(a, b, unit) { return med(a, unit, b, unit) }

function med(a, ua, b, ub,    r, n, k, x, s, i, j, t) {
	n = 0
	for (r = 1; r <= rounds; r++) {
		k = a "|" ua "|" r
		if (!(k in v))
			continue
		x = v[k] + 0
		if (b != "") {
			if (!((b "|" ub "|" r) in v) || v[b "|" ub "|" r] + 0 == 0)
				continue
			x /= v[b "|" ub "|" r]
		}
		s[++n] = x
	}
	if (n == 0)
		return ""
	for (i = 2; i <= n; i++)
		for (j = i; j > 1 && s[j - 1] > s[j]; j--) {
			t = s[j]; s[j] = s[j - 1]; s[j - 1] = t
		}
	return n % 2 ? s[(n + 1) / 2] : (s[n / 2] + s[n / 2 + 1]) / 2
}

# most returns the largest figure of name in unit over the rounds ("" if
# none).
function most(name, unit,    r, k, m) {
	m = ""
	for (r = 1; r <= rounds; r++) {
		k = name "|" unit "|" r
		if ((k in v) && (m == "" || v[k] + 0 > m))
			m = v[k] + 0
	}
	return m
}

# info prints a figure that has no target, with what it tells.
function info(label, x, note) {
	printf "%-64s %12s %4s %-10s %s\n", label, x == "" ? "-" : sprintf("%.1f", x), "", "", note
}

# mostTwoWriters returns the largest figure in unit of the two-writer
# fresh stores (sized, grown from Go and from JSON events) over the rounds
# ("" if none).
function mostTwoWriters(unit,    names, i, x, m) {
	split("BenchmarkFreshStoreSized/events=go/writers=2-2 BenchmarkFreshStore/events=go/writers=2-2 BenchmarkFreshStore/events=json/writers=2-2", names, " ")
	m = ""
	for (i = 1; i <= 3; i++) {
		x = most(names[i], unit)
		if (x != "" && (m == "" || x > m))
			m = x
	}
	return m
}

# ref prints a figure beside what it was in another hour (a target of
# "no worse", which only an interleaved run decides).
function ref(label, x, was) {
	printf "%-64s %12s %4s %-10s %s\n", label, x == "" ? "-" : sprintf("%.0f", x), "was", was, "no worse: compare in one hour"
}

# row prints a figure against its target: want is "<=" or ">=".
function row(label, x, want, target, fmt_,    verdict) {
	if (x == "") {
		printf "%-64s %12s %4s %-10s %s\n", label, "-", want, target, "not measured"
		return
	}
	x += 0 # a number, not a string compared as one
	verdict = (want == "<=" ? x <= target : x >= target) ? "met" : "not met"
	printf "%-64s %12" fmt_ " %4s %-10s %s\n", label, x, want, target, verdict
}

END {
	fs = "BenchmarkFreshStore/events="
	printf "\n## The targets: medians over %d round(s)\n\n", rounds
	printf "%-64s %12s %4s %-10s %s\n", "figure", "now", "", "target", ""
	host = median("BenchmarkHashing/impl=raw/block=16/tokens=1024-2", "ns/op")
	if (host != "")
		printf "%-64s %12.1f %4s %-10s %s\n", "the host: raw XXH3 over 1,024 tokens (ns)", host, "was", "293-296", "computation alone: the hour's speed"
	row("store per block, one writer, fresh process, sized (ns)", median("BenchmarkFreshStoreSized/events=go/writers=1-2", "ns/block"), "<=", 50, ".1f")
	row("  the same, grown, events built in Go (ns)", median(fs "go/writers=1-2", "ns/block"), "<=", 50, ".1f")
	row("  the same, grown, events decoded from JSON (ns)", median(fs "json/writers=1-2", "ns/block"), "<=", 50, ".1f")
	row("two writers against one, fresh processes, grown, Go events", ratio(fs "go/writers=1-2", fs "go/writers=2-2", "ns/block"), ">=", 1.7, ".2f")
	row("  the same, grown, JSON events", ratio(fs "json/writers=1-2", fs "json/writers=2-2", "ns/block"), ">=", 1.7, ".2f")
	row("  the same, sized", ratio("BenchmarkFreshStoreSized/events=go/writers=1-2", "BenchmarkFreshStoreSized/events=go/writers=2-2", "ns/block"), ">=", 1.7, ".2f")
	info("  the machine's CPU idle in two writers' sized stores (median %)", median("BenchmarkFreshStoreSized/events=go/writers=2-2", "host-idle-%"), "a core left idle: a writer waited or ended first")
	info("  its CPU used by other processes in any fresh store (most %)", mostTwoWriters("host-other-%"), "a core taken by another process: that round's ratio means little")
	info("  its CPU stolen by the hypervisor in any fresh store (most %)", mostTwoWriters("host-steal-%"), "wall time lost to the host: a ratio of that round means little")
	ps = "BenchmarkParallelStore/impl=compressed"
	row("  one process, GOMAXPROCS 1 against 2, grown (ParallelStore)", ratio(ps, ps "-2", "ns/block"), ">=", 1.7, ".2f")
	row("  the same, sized", ratio(ps "-sized", ps "-sized-2", "ns/block"), ">=", 1.7, ".2f")
	row("  the field's corpus, in one process (Corpus, events)", ratio("BenchmarkCorpus/ops=events/writers=1-2", "BenchmarkCorpus/ops=events/writers=2-2", "ns/block-op"), ">=", 1.7, ".2f")
	row("bytes per worker-block pair, trace", median("BenchmarkShaped/op=lookup/impl=compressed-2", "B/pair"), "<=", 20, ".2f")
	ref("lookup per request, trace, FindMatches (ns)", median("BenchmarkShaped/op=lookup/impl=compressed-2", "ns/op"), "7990")
	ref("shared-prefix lookup, FindMatches (ns)", median("BenchmarkSharedPrefix/impl=compressed-2", "ns/op"), "3367")
	ref("shared-prefix lookup, AppendMatches (ns)", median("BenchmarkSharedPrefix/impl=compressed/api=append-2", "ns/op"), "743")
	lane = median("BenchmarkIndexer/impl=compressed-sized/lanes=2", "block-ops/lane-cpu-s")
	row("block ops per lane CPU-second, field's benchmark, 1.5 s window (M)", lane == "" ? "" : lane / 1e6, ">=", 25, ".2f")
	info("  the machine's CPU stolen by the hypervisor in the window (most %)", most("BenchmarkIndexer/impl=compressed-sized/lanes=2", "host-steal-%"), "not in the lanes' CPU; slows the window's wall clock")
	if (sustained != "")
		row("  the same at the sustained rate (M; one search, SUSTAINED=1)", sustained, ">=", 25, ".2f")
	tr = "BenchmarkTail/op=remove/impl=compressed/run="
	ts = "BenchmarkTail/op=store/impl=compressed/run="
	row("tail-first removal against a store, run of 256", ratio(tr "256-2", ts "256-2", "ns/block"), "<=", 2, ".2f")
	row("  run of 1,024", ratio(tr "1024-2", ts "1024-2", "ns/block"), "<=", 2, ".2f")
	row("  run of 16,384", ratio(tr "16384-2", ts "16384-2", "ns/block"), "<=", 2, ".2f")
	row("  removal at 16,384 against at 256 (flat: within 1.5x)", ratio(tr "16384-2", tr "256-2", "ns/block"), "<=", 1.5, ".2f")
	print "\nwas: before the shared engine-hash table (92e87dc, results/shared-table-bench.txt)"
}
