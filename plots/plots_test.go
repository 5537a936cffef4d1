package plots

import (
	"bytes"
	"encoding/xml"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
)

// svgTexts parses b as SVG and returns the root element's name and every
// text element's content.
func svgTexts(t *testing.T, b []byte) (string, []string) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var root string
	var texts []string
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not valid XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			inText = el.Name.Local == "text"
		case xml.EndElement:
			inText = false
		case xml.CharData:
			if inText {
				texts = append(texts, strings.TrimSpace(string(el)))
			}
		}
	}
	return root, texts
}

// Every plot renders from the fixtures in testdata (files named as in
// results/) into a valid SVG whose texts name its series, its axes and the
// machine and commit of the fixture's header.
func TestAllRender(t *testing.T) {
	want := map[string][]string{
		"plot-indexer-throughput.svg":     {"single", "compressed/lanes=2", "saturation point", "offered block-ops/s (log)"},
		"plot-indexer-latency.svg":        {"single", "compressed/lanes=2", "p99.9", "latency µs (log)"},
		"plot-scaling.svg":                {"FindMatchesParallel/impl=tree", "FindMatchesParallel/impl=compressed", "Mixed/impl=single/reads=90", "cores (GOMAXPROCS, log)", "Test CPU x 16 cores, commit abc1234"},
		"plot-replay-ttft-cdf.svg":        {"round_robin", "kv", "TTFT ms (log)"},
		"plot-replay-reuse.svg":           {"pooled LRU of the fleet", "unbounded cache", "of pooled)"},
		"plot-replay-frontier.svg":        {"overlap_weight sweep, temperature=0", "overlap_weight sweep, temperature=0.1", "kv (defaults)", "mean TTFT ms"},
		"plot-replay-tiers.svg":           {"kv_tiers sweep, host tier 2x the device", "host_weight sweep", "kv (defaults)"},
		"plot-replay-approx-capacity.svg": {"kv_approx_lru's accuracy against approx_capacity", "approx_precision", "approx_recall", "reuse / kv's reuse"},
		"plot-replay-approx-ttl.svg":      {"kv_approx_ttl's accuracy against approx_ttl", "approx_recall"},
	}
	for _, spec := range All {
		t.Run(spec.Output, func(t *testing.T) {
			src, err := ReadSource(filepath.Join("testdata", spec.Input))
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := spec.Render(&buf, src); err != nil {
				t.Fatal(err)
			}
			root, texts := svgTexts(t, buf.Bytes())
			if root != "svg" {
				t.Fatalf("root element %q, want svg", root)
			}
			all := strings.Join(texts, "\n")
			for _, w := range want[spec.Output] {
				if !strings.Contains(all, w) {
					t.Errorf("no text %q among %q", w, texts)
				}
			}
			if !strings.Contains(all, "commit abc1234") {
				t.Errorf("title lacks the commit: %q", texts)
			}
		})
	}
	if len(want) != len(All) {
		t.Fatalf("%d plots tested, %d in All", len(want), len(All))
	}
}

// Data a plot cannot draw is an error naming the file, never a panic.
func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		render func(io.Writer, Source) error
		body   string
		want   string
	}{
		{Indexer, ``, "no sweep steps"},
		{Indexer, `{"index": "single"}` + "\n" + `{"index": `, "f.json: result 2"},
		{IndexerLatency, `{"index": "single", "query_service": {"p50_ns": 0}}`, "no lookup latencies"},
		{TTFTCDF, `{"results": [{"router": "kv"}]}`, "no TTFT percentiles"},
		{Reuse, `{"results": []}`, "no routers"},
		{Frontier, `{"sweep": []}`, "no sweep points"},
		{func(w io.Writer, s Source) error { return Scaling(w, s, ScalingSeries, "blocks/s") }, "BenchmarkOther 1 2 ns/op\n", "no benchmarks"},
	} {
		err := tc.render(io.Discard, ParseSource("f.json", []byte(tc.body)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.body, err, tc.want)
		}
	}
	// A zero on a log axis panics inside the library: write returns it.
	p := newPlot("zero", Source{}, "x", "y")
	logAxis(&p.Y)
	if err := addLine(p, 0, "zero", plotter.XYs{{X: 1, Y: 0}, {X: 2, Y: 0}}); err != nil {
		t.Fatal(err)
	}
	if err := write(io.Discard, p); err == nil {
		t.Error("a zero on a log axis rendered")
	}
}

func TestProvenance(t *testing.T) {
	for header, want := range map[string]string{
		"# go run x\n# go version go1.26.8 linux/amd64; AMD EPYC x 2 cores; commit 6499cb3\n{}":                     "AMD EPYC x 2 cores, commit 6499cb3",
		"# kvradix concurrency scaling\n# commit: b616ac4 (bench binary)\n# cpu: Intel(R) Xeon(R) Processor x 16\n": "Intel(R) Xeon(R) Processor x 16 cores, commit b616ac4",
		"{}": "",
	} {
		if got := ParseSource("f", []byte(header)).Provenance(); got != want {
			t.Errorf("%q: %q, want %q", header, got, want)
		}
	}
	src := ParseSource("f", []byte("# a\n#b\n{\"x\": 1}\n"))
	if len(src.Header) != 2 || src.Header[1] != "b" || string(src.Body) != "{\"x\": 1}\n" {
		t.Fatalf("%+v", src)
	}
}

func TestLogTicks(t *testing.T) {
	got := logTicks{}.Ticks(150, 2500)
	var labels []string
	for _, tk := range got {
		labels = append(labels, tk.Label)
	}
	if strings.Join(labels, ",") != "200,500,1k,2k" {
		t.Fatalf("%q", labels)
	}
	got = logTicks{}.Ticks(1, 1e6)
	labels = labels[:0]
	for _, tk := range got {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if strings.Join(labels, ",") != "1,10,100,1k,10k,100k,1M" || len(got) != 19 {
		t.Fatalf("%q (%d ticks)", labels, len(got))
	}
	if (logTicks{}).Ticks(0, 10) != nil {
		t.Fatal("ticks from 0")
	}
}
