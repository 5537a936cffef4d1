package plots

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kvradix/kvradix/openloop"
)

// indexerSweep reads `loadgen indexer -sweep -json`: a line per indexer,
// each the run at the shortest window it kept up with, carrying every step.
func indexerSweep(src Source) ([]openloop.Result, error) {
	var out []openloop.Result
	dec := json.NewDecoder(bytes.NewReader(src.Body))
	for dec.More() {
		var r openloop.Result
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s: result %d: %w", src.Name, len(out)+1, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// name is an indexer's legend name.
func name(impl string, lanes int) string {
	if impl == "single" {
		return impl
	}
	return fmt.Sprintf("%s/lanes=%d", impl, lanes)
}

// Indexer plots, per indexer, achieved against offered block operations
// over the sweep's steps, with the fastest step that kept up (its
// generator valid) marked.
func Indexer(w io.Writer, src Source) error {
	results, err := indexerSweep(src)
	if err != nil {
		return err
	}
	p := newPlot("Indexers: achieved vs offered throughput", src, "offered block-ops/s (log)", "achieved block-ops/s (log)")
	logAxis(&p.X)
	logAxis(&p.Y)
	p.Legend.Left = true // above the diagonal: nothing achieves more than offered
	var lo, hi float64
	var kept plotter.XYs
	for i, r := range results {
		var xys plotter.XYs
		last := -1
		for _, pt := range r.Sweep {
			x, y := pt.OfferedBlockOpsPerSec, pt.AchievedBlockOpsPerSec
			if x <= 0 || y <= 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: x, Y: y})
			if pt.KeptUp && pt.GeneratorValid && (last < 0 || x > xys[last].X) {
				last = len(xys) - 1
			}
			if lo == 0 || x < lo {
				lo = x
			}
			hi = max(hi, x, y)
		}
		if len(xys) == 0 {
			continue
		}
		if err := addLine(p, i, name(r.Index, r.Lanes), xys); err != nil {
			return err
		}
		if last >= 0 {
			kept = append(kept, xys[last])
		}
	}
	if hi == 0 {
		return errNoData(src, "sweep steps")
	}
	if err := addRef(p, "achieved = offered", plotter.XYs{{X: lo, Y: lo}, {X: hi, Y: hi}}, gray); err != nil {
		return err
	}
	if len(kept) > 0 {
		s, err := plotter.NewScatter(kept)
		if err != nil {
			return err
		}
		s.GlyphStyle = glyph(0)
		s.GlyphStyle.Radius = vg.Points(7)
		s.GlyphStyle.Shape = draw.RingGlyph{}
		p.Add(s)
		p.Legend.Add("saturation point (fastest step kept up, valid)", s)
	}
	return write(w, p)
}

// IndexerLatency plots each indexer's lookup latency percentiles (at its
// reported step): one line per indexer over p50, p99 and p99.9.
func IndexerLatency(w io.Writer, src Source) error {
	results, err := indexerSweep(src)
	if err != nil {
		return err
	}
	p := newPlot("Indexers: lookup latency", src, "percentile", "latency µs (log)")
	logAxis(&p.Y)
	p.NominalX("p50", "p99", "p99.9")
	drawn := 0
	for i, r := range results {
		var xys plotter.XYs
		for x, v := range []uint64{r.QueryService.P50, r.QueryService.P99, r.QueryService.P999} {
			if v > 0 { // a log axis has no zero
				xys = append(xys, plotter.XY{X: float64(x), Y: float64(v) / 1e3})
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := addLine(p, i, name(r.Index, r.Lanes), xys); err != nil {
			return err
		}
		drawn++
	}
	if drawn == 0 {
		return errNoData(src, "lookup latencies")
	}
	return write(w, p)
}
