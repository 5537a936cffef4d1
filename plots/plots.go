// Package plots draws the committed results as SVG files with
// gonum.org/v1/plot: indexer throughput and lookup latency, concurrency
// scaling, and the replay's TTFT, reuse and policy frontier.
//
// Every plot is a function of one results file: its data and the
// provenance in the file's header comments (the machine and the commit
// named in the title). The files are those `make plots` finds in results/:
//
//	loadgen-sweep.json   Indexer and IndexerLatency
//	scaling-16core.txt   Scaling (go test -bench output)
//	replay.json          TTFTCDF and Reuse
//	replay-sweep.json    Frontier
//	replay-tiers.json    Frontier
//	replay-approx-capacity.json, replay-approx-ttl.json  Accuracy
package plots

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Width and Height size every plot: readable at a README's width.
const (
	Width  = 7 * vg.Inch
	Height = 4.5 * vg.Inch
)

// Source is a results file split into its header comments and its body.
type Source struct {
	Name   string   // file name, for errors
	Header []string // leading lines starting with '#', without the '#'
	Body   []byte
}

// ReadSource reads a results file.
func ReadSource(path string) (Source, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Source{}, err
	}
	return ParseSource(path, b), nil
}

// ParseSource splits b into its leading '#' comment lines and the rest.
func ParseSource(name string, b []byte) Source {
	s := Source{Name: name}
	for len(b) > 0 && b[0] == '#' {
		line, rest, _ := bytes.Cut(b, []byte("\n"))
		s.Header = append(s.Header, strings.TrimSpace(string(line[1:])))
		b = rest
	}
	s.Body = b
	return s
}

// JSON decodes the body into v.
func (s Source) JSON(v any) error {
	if err := json.Unmarshal(s.Body, v); err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	return nil
}

var (
	commitRE = regexp.MustCompile(`commit:?\s+([0-9a-f]{7,40})`)
	// "go1.26.8 linux/amd64; AMD EPYC x 2 cores; commit ..." or "cpu: Intel(R) Xeon(R) Processor x 16"
	machineRE = regexp.MustCompile(`(?:; |cpu: )([^;]+? x \d+)(?: cores)?(?:;|$)`)
)

// Provenance returns "machine, commit" from the header, as far as it
// names them.
func (s Source) Provenance() string {
	var machine, commit string
	for _, h := range s.Header {
		if m := machineRE.FindStringSubmatch(h); m != nil && machine == "" {
			machine = m[1] + " cores"
		}
		if m := commitRE.FindStringSubmatch(h); m != nil && commit == "" {
			commit = "commit " + m[1]
		}
	}
	parts := []string{}
	for _, p := range []string{machine, commit} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ", ")
}

// newPlot returns a plot titled with what it shows and where it was
// measured, its axes labelled.
func newPlot(title string, src Source, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	if prov := src.Provenance(); prov != "" {
		p.Title.Text += "\n" + prov
	}
	p.X.Label.Text, p.Y.Label.Text = x, y
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

// write renders p as SVG. The plotting library panics on some data (a
// zero on a log axis); that is returned as an error.
func write(w io.Writer, p *plot.Plot) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("plot %q: %v", p.Title.Text, r)
		}
	}()
	wt, err := p.WriterTo(Width, Height, "svg")
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	if _, err := wt.WriteTo(bw); err != nil {
		return err
	}
	return bw.Flush()
}

// addLine adds a line with point glyphs in the i-th style, named in the
// legend.
func addLine(p *plot.Plot, i int, name string, xys plotter.XYs) error {
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	l.Color, s.Color = plotutil.Color(i), plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i)
	s.Shape = plotutil.Shape(i)
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

// addRef adds a dashed reference line through xys, named in the legend.
func addRef(p *plot.Plot, name string, xys plotter.XYs, c color.Color) error {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	l.Color = c
	l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// gray is the colour of reference lines.
var gray = color.Gray{Y: 96}

// logAxis makes the axis logarithmic, labelled at 1, 2 and 5 times the
// powers of ten.
func logAxis(a *plot.Axis) {
	a.Scale = plot.LogScale{}
	a.Tick.Marker = logTicks{}
}

// logTicks marks 1-2-5 steps of each decade in range; every one is labelled
// in a span of at most two decades, the powers of ten only beyond.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi >= lo) {
		return nil
	}
	labelAll := hi/lo <= 100
	var ticks []plot.Tick
	for dec := math.Pow(10, math.Floor(math.Log10(lo))); dec <= hi; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := m * dec
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || labelAll {
				t.Label = si(v)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// si formats v compactly: 200, 5k, 1.5M.
func si(v float64) string {
	for _, u := range []struct {
		div  float64
		unit string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= u.div {
			return strconv.FormatFloat(v/u.div, 'g', 3, 64) + u.unit
		}
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// errNoData reports a results file without what a plot needs.
func errNoData(src Source, what string) error {
	return fmt.Errorf("%s: no %s to plot", src.Name, what)
}

// glyph is a scatter's point style.
func glyph(i int) draw.GlyphStyle {
	return draw.GlyphStyle{Color: plotutil.Color(i), Radius: vg.Points(3.5), Shape: plotutil.Shape(i)}
}

// Spec is one plot: the results file it reads and the SVG it writes, both
// relative to the results directory.
type Spec struct {
	Input, Output string
	Render        func(io.Writer, Source) error
}

// All lists every plot `make plots` draws.
var All = []Spec{
	{"loadgen-sweep.json", "plot-indexer-throughput.svg", Indexer},
	{"loadgen-sweep.json", "plot-indexer-latency.svg", IndexerLatency},
	{"scaling-16core.txt", "plot-scaling.svg", func(w io.Writer, s Source) error { return Scaling(w, s, ScalingSeries, "blocks/s") }},
	{"replay.json", "plot-replay-ttft-cdf.svg", TTFTCDF},
	{"replay.json", "plot-replay-reuse.svg", Reuse},
	{"replay-sweep.json", "plot-replay-frontier.svg", Frontier},
	{"replay-tiers.json", "plot-replay-tiers.svg", Frontier},
	{"replay-approx-capacity.json", "plot-replay-approx-capacity.svg", Accuracy},
	{"replay-approx-ttl.json", "plot-replay-approx-ttl.svg", Accuracy},
}
