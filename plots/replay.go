package plots

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kvradix/kvradix/replay"
)

// TTFTCDF plots each router's TTFT distribution (replay -json's
// ttft_percentiles_ms) as a CDF.
func TTFTCDF(w io.Writer, src Source) error {
	var rep replay.Report
	if err := src.JSON(&rep); err != nil {
		return err
	}
	p := newPlot("Replay: time to first token, per router", src, "TTFT ms (log)", "share of requests")
	logAxis(&p.X)
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = false, false
	drawn := 0
	for i, r := range rep.Results {
		var xys plotter.XYs
		for pct, ms := range r.TTFTPercentiles {
			if ms > 0 {
				xys = append(xys, plotter.XY{X: ms, Y: float64(pct) / 100})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("%s: %w", r.Router, err)
		}
		l.Color, l.Dashes, l.Width = plotutil.Color(i), plotutil.Dashes(i), vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(r.Router, l)
		drawn++
	}
	if drawn == 0 {
		return errNoData(src, "TTFT percentiles")
	}
	return write(w, p)
}

// Reuse plots each router's prefix-cache reuse as a bar, with the pooled
// and unbounded references as lines across.
func Reuse(w io.Writer, src Source) error {
	var rep replay.Report
	if err := src.JSON(&rep); err != nil {
		return err
	}
	if len(rep.Results) == 0 {
		return errNoData(src, "routers")
	}
	p := newPlot("Replay: prompt tokens reused, per router", src, "", "reuse (cached / prompt tokens)")
	p.Y.Min = 0
	vs := make(plotter.Values, len(rep.Results))
	names := make([]string, len(rep.Results))
	for i, r := range rep.Results {
		vs[i] = r.ReuseRatio
		names[i] = fmt.Sprintf("%s (%.2f of pooled)", r.Router, r.RoutingEfficiency)
	}
	p.NominalX(names...)
	b, err := plotter.NewBarChart(vs, vg.Points(40))
	if err != nil {
		return err
	}
	b.Color, b.LineStyle.Width = plotutil.Color(2), 0
	p.Add(b)
	p.Legend.Add("router", b)
	x0, x1 := -0.5, float64(len(vs))-0.5
	for _, ref := range []struct {
		name string
		y    float64
		i    int
	}{{"pooled LRU of the fleet", rep.ReusePooled, 0}, {"unbounded cache", rep.ReuseUnbounded, 1}} {
		if err := addRef(p, fmt.Sprintf("%s: %.3f", ref.name, ref.y), plotter.XYs{{X: x0, Y: ref.y}, {X: x1, Y: ref.y}}, plotutil.Color(ref.i)); err != nil {
			return err
		}
	}
	p.Y.Max = max(rep.ReuseUnbounded, rep.ReusePooled, slices.Max(vs)) * 1.25
	return write(w, p)
}

// Frontier plots a policy sweep (replay -sweep -json): reuse against mean
// TTFT, one line per value of every swept setting but the first, the
// first's values labelled at their points. The default routers are marked.
func Frontier(w io.Writer, src Source) error {
	var rep replay.SweepReport
	if err := src.JSON(&rep); err != nil {
		return err
	}
	if len(rep.Points) == 0 {
		return errNoData(src, "sweep points")
	}
	first := firstSetting(rep.Points)
	title := "Replay: reuse vs latency, KV router policy sweep"
	if rep.Offload > 0 {
		title = fmt.Sprintf("Replay: reuse vs latency, %s sweep, host tier %gx the device", rep.Points[0].Router, rep.Offload)
	}
	p := newPlot(title, src, "reuse (cached or loaded / prompt tokens)", "mean TTFT ms")
	p.Legend.Top, p.Legend.Left = false, true // reuse up, latency down: the corner left free
	// Group points by the other settings' values.
	groups := map[string]plotter.XYs{}
	labels := map[string][]string{}
	for _, pt := range rep.Points {
		key := otherSettings(pt.Settings, first)
		groups[key] = append(groups[key], plotter.XY{X: pt.ReuseRatio, Y: pt.TTFT.Mean})
		labels[key] = append(labels[key], fmt.Sprintf("%g", pt.Settings[first]))
	}
	for i, key := range slices.Sorted(maps.Keys(groups)) {
		name := first + " sweep"
		if key != "" {
			name += ", " + key
		}
		if err := addLine(p, i, name, groups[key]); err != nil {
			return err
		}
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: groups[key], Labels: labels[key]})
		if err != nil {
			return err
		}
		l.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(3)}
		for j := range l.TextStyle {
			l.TextStyle[j].Font.Size = vg.Points(7)
		}
		p.Add(l)
	}
	for k, r := range rep.Results {
		s, err := plotter.NewScatter(plotter.XYs{{X: r.ReuseRatio, Y: r.TTFT.Mean}})
		if err != nil {
			return err
		}
		s.GlyphStyle = glyph(len(groups) + k)
		s.GlyphStyle.Radius = vg.Points(5)
		p.Add(s)
		p.Legend.Add(r.Router+" (defaults)", s)
	}
	return write(w, p)
}

// firstSetting is the swept setting listed first: the one whose value
// changes least often along the points (Sweep varies the first slowest);
// with one setting, that one.
func firstSetting(points []replay.SweepPoint) string {
	names := slices.Sorted(maps.Keys(points[0].Settings))
	best, fewest := "", len(points)+1
	for _, n := range names {
		changes := 0
		for i := 1; i < len(points); i++ {
			if points[i].Settings[n] != points[i-1].Settings[n] {
				changes++
			}
		}
		if changes < fewest {
			best, fewest = n, changes
		}
	}
	return best
}

func otherSettings(settings map[string]float64, except string) string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		if k != except {
			kv = append(kv, fmt.Sprintf("%s=%g", k, settings[k]))
		}
	}
	return strings.Join(kv, " ")
}

// Accuracy plots a one-setting sweep of an approximate router (replay
// -sweep approx_capacity=... or approx_ttl=... -json): its precision and
// recall, and its reuse as a share of the kv router's (from events), at
// each value, on a log axis.
func Accuracy(w io.Writer, src Source) error {
	var rep replay.SweepReport
	if err := src.JSON(&rep); err != nil {
		return err
	}
	if len(rep.Points) == 0 {
		return errNoData(src, "sweep points")
	}
	kv := slices.IndexFunc(rep.Results, func(r replay.Result) bool { return r.Router == replay.KV })
	if kv < 0 || rep.Results[kv].ReuseRatio == 0 {
		return errNoData(src, "kv baseline with reuse")
	}
	setting := firstSetting(rep.Points)
	p := newPlot(fmt.Sprintf("Replay without events: %s's accuracy against %s (blocks %d)", rep.Points[0].Router, setting, rep.Blocks),
		src, setting, "share")
	logAxis(&p.X)
	p.Legend.Top, p.Legend.Left = false, true
	var prec, rec, reuse plotter.XYs
	for _, pt := range rep.Points {
		x := pt.Settings[setting]
		if pt.ApproxPrecision != nil {
			prec = append(prec, plotter.XY{X: x, Y: *pt.ApproxPrecision})
		}
		if pt.ApproxRecall != nil {
			rec = append(rec, plotter.XY{X: x, Y: *pt.ApproxRecall})
		}
		reuse = append(reuse, plotter.XY{X: x, Y: pt.ReuseRatio / rep.Results[kv].ReuseRatio})
	}
	for i, l := range []struct {
		name string
		xys  plotter.XYs
	}{{"approx_precision", prec}, {"approx_recall", rec}, {"reuse / kv's reuse", reuse}} {
		if len(l.xys) == 0 {
			continue
		}
		if err := addLine(p, i, l.name, l.xys); err != nil {
			return err
		}
	}
	p.Y.Min, p.Y.Max = 0, 1.1
	return write(w, p)
}
