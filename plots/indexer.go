package plots

import (
	"fmt"
	"io"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// IndexerSweep is what the indexer plots read of `loadgen indexer -sweep
// -json`.
type IndexerSweep struct {
	Trace   string `json:"trace"`
	Results []struct {
		Impl          string  `json:"impl"`
		Lanes         int     `json:"lanes"`
		ThresholdOpsS float64 `json:"threshold_ops_s"`
		FindMatchesUs struct {
			P50  float64 `json:"p50"`
			P99  float64 `json:"p99"`
			P999 float64 `json:"p999"`
		} `json:"find_matches_us"`
		Sweep []struct {
			OfferedOpsS       float64 `json:"offered_ops_s"`
			AchievedOpsS      float64 `json:"achieved_ops_s"`
			OfferedBlockOpsS  float64 `json:"offered_block_ops_s"`
			AchievedBlockOpsS float64 `json:"achieved_block_ops_s"`
			Saturated         bool    `json:"saturated"`
		} `json:"sweep"`
	} `json:"results"`
}

// name is an indexer's legend name.
func name(impl string, lanes int) string {
	if impl == "single" {
		return impl
	}
	return fmt.Sprintf("%s/lanes=%d", impl, lanes)
}

// Indexer plots, per indexer, achieved against offered throughput over the
// sweep's steps (block operations where the file has them, else
// operations), with the last step that kept up marked.
func Indexer(w io.Writer, src Source) error {
	var sw IndexerSweep
	if err := src.JSON(&sw); err != nil {
		return err
	}
	blocks := len(sw.Results) > 0 && len(sw.Results[0].Sweep) > 0 && sw.Results[0].Sweep[0].OfferedBlockOpsS > 0
	unit := "ops/s (events + lookups)"
	if blocks {
		unit = "block-ops/s"
	}
	p := newPlot("Indexers: achieved vs offered throughput", src, "offered "+unit+" (log)", "achieved "+unit+" (log)")
	logAxis(&p.X)
	logAxis(&p.Y)
	p.Legend.Left = true // above the diagonal: nothing achieves more than offered
	var lo, hi float64
	var kept plotter.XYs
	for i, r := range sw.Results {
		var xys plotter.XYs
		last := -1
		for _, pt := range r.Sweep {
			x, y := pt.OfferedOpsS, pt.AchievedOpsS
			if blocks {
				x, y = pt.OfferedBlockOpsS, pt.AchievedBlockOpsS
			}
			if x <= 0 || y <= 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: x, Y: y})
			if !pt.Saturated {
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
		if err := addLine(p, i, name(r.Impl, r.Lanes), xys); err != nil {
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
		p.Legend.Add("saturation point (last step kept up)", s)
	}
	return write(w, p)
}

// IndexerLatency plots each indexer's lookup latency percentiles (at its
// reported step): one line per indexer over p50, p99 and p99.9.
func IndexerLatency(w io.Writer, src Source) error {
	var sw IndexerSweep
	if err := src.JSON(&sw); err != nil {
		return err
	}
	p := newPlot("Indexers: FindMatches latency", src, "percentile", "latency µs (log)")
	logAxis(&p.Y)
	p.NominalX("p50", "p99", "p99.9")
	drawn := 0
	for i, r := range sw.Results {
		var xys plotter.XYs
		for x, v := range []float64{r.FindMatchesUs.P50, r.FindMatchesUs.P99, r.FindMatchesUs.P999} {
			if v > 0 { // a log axis has no zero
				xys = append(xys, plotter.XY{X: float64(x), Y: v})
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := addLine(p, i, name(r.Impl, r.Lanes), xys); err != nil {
			return err
		}
		drawn++
	}
	if drawn == 0 {
		return errNoData(src, "lookup latencies")
	}
	return write(w, p)
}
