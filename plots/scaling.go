package plots

import (
	"bytes"
	"cmp"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
	"gonum.org/v1/plot/plotter"
)

// ScalingSeries selects the benchmarks the scaling plot draws: the
// parallel reads of every index and the 90%-read mix of every indexer.
var ScalingSeries = regexp.MustCompile(`^Benchmark(FindMatchesParallel/.*|ApplyParallel.*|Mixed/.*reads=90)$`)

var procsRE = regexp.MustCompile(`^(.*)-(\d+)$`)

// Scaling plots, per benchmark matching series, the median of a unit (for
// example "blocks/s") against GOMAXPROCS, from go test -bench output run
// at several -cpu values.
func Scaling(w io.Writer, src Source, series *regexp.Regexp, unit string) error {
	// samples[name][procs] are the unit's values.
	samples := map[string]map[int][]float64{}
	r := benchfmt.NewReader(bytes.NewReader(src.Body), src.Name)
	for r.Scan() {
		res, ok := r.Result().(*benchfmt.Result)
		if !ok {
			continue // syntax errors and unit metadata: not results
		}
		full, procs := string(res.Name.Full()), 1
		if m := procsRE.FindStringSubmatch(full); m != nil {
			full = m[1]
			procs, _ = strconv.Atoi(m[2])
		}
		name := "Benchmark" + full
		v, ok := res.Value(unit)
		if !ok || !series.MatchString(name) {
			continue
		}
		if samples[name] == nil {
			samples[name] = map[int][]float64{}
		}
		samples[name][procs] = append(samples[name][procs], v)
	}
	if err := r.Err(); err != nil {
		return err
	}
	if len(samples) == 0 {
		return errNoData(src, "benchmarks matching "+series.String()+" in "+unit)
	}
	p := newPlot("Concurrency scaling (median of runs)", src, "cores (GOMAXPROCS, log)", unit+" (log)")
	logAxis(&p.X)
	logAxis(&p.Y)
	p.Legend.Left = true // lines rise to the right
	for i, name := range slices.Sorted(maps.Keys(samples)) {
		var xys plotter.XYs
		for _, procs := range slices.Sorted(maps.Keys(samples[name])) {
			xys = append(xys, plotter.XY{X: float64(procs), Y: median(samples[name][procs])})
		}
		if err := addLine(p, i, strings.TrimPrefix(name, "Benchmark"), xys); err != nil {
			return err
		}
	}
	p.Y.Max *= 12 // headroom: the legend sits above the lines
	return write(w, p)
}

// median of xs (not empty; sorted in place).
func median(xs []float64) float64 {
	slices.SortFunc(xs, cmp.Compare)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}
