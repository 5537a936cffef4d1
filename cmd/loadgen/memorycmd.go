package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/kvradix/kvradix/openloop"
	"github.com/kvradix/kvradix/shardpool"
)

// runMemory measures each indexer's memory over the replay by Dynamo's
// indexer_memory method (openloop.MeasureMemory): a JSON line each, or a
// table.
func runMemory(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("memory", stderr)
	var c indexerConfig
	c.work.register(fs)
	c.registerCorpus(fs)
	c.window = maxDuration // deadlines do not matter to memory
	var mc openloop.MemoryConfig
	fs.IntVar(&mc.Samples, "samples", 100, "evenly spaced points of the replay at which the index is measured (Dynamo: 100)")
	fs.BoolVar(&mc.SkipQueries, "skip-queries", false, "replay the events only")
	fs.StringVar(&c.compare, "compare", "single,pool,compressed", "indexers: single, pool (over ConcurrentTree), compressed (pool over CompressedTree)")
	fs.StringVar(&c.lanes, "lanes", "2", "pool lanes; a comma list runs one pool per value")
	c.out.register(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if mc.Samples < 1 || mc.Samples > 10000 {
		return fmt.Errorf("-samples %d, want in [1, 10000]", mc.Samples)
	}
	impls, err := parseImpls(c.compare, c.lanes)
	if err != nil {
		return err
	}
	progress := c.progress(stderr)
	cp, err := c.buildCorpus(progress)
	if err != nil {
		return err
	}
	var reps []openloop.MemoryReport
	for _, im := range impls {
		r := openloop.MeasureMemory(cp, im, mc)
		r.NumGPUBlocks = c.corpus.Blocks
		if c.corpusFile != "" {
			r.NumGPUBlocks = 0 // the file does not say
		}
		fmt.Fprintf(progress, "%v: %.1f B a membership (time average), peak %.1f MB\n", im, r.TimeAvgBytesPerMembership, float64(r.PeakBackendBytes)/1e6)
		reps = append(reps, r)
	}
	return writeLines(c.out, stdout, reps, func() { printMemory(stdout, &c, reps) }, func() { printMemoryBench(stdout, reps) })
}

func printMemory(w io.Writer, c *indexerConfig, reps []openloop.MemoryReport) {
	b := c.corpus
	fmt.Fprintf(w, "trace: %s; %d engines x %d copies, blocks of %d tokens, length factor %d\n", b.Trace, b.Workers, b.Dup, b.BlockSize, b.LengthFactor)
	fmt.Fprintln(w, "live heap of the index (after GC, less the heap before it was built) over the memberships a set model holds, at evenly spaced points of the replay")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "index\tB/membership time avg\tmean B/mean memberships\tmax\tfinal\tB/unique block\tpeak MB\tmean memberships\tsamples\treplay s\t")
	for _, r := range reps {
		fmt.Fprintf(tw, "%v\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%d\t%.2f\t\n", shardpool.Impl{Name: r.Index, Lanes: r.Lanes},
			r.TimeAvgBytesPerMembership, r.MeanBytesOverMeanMemberships, r.MaxBytesPerMembership, r.FinalBytesPerMembership,
			r.TimeAvgBytesPerUniqueBlock, float64(r.PeakBackendBytes)/1e6, r.MeanMemberships, len(r.Samples), r.ReplaySecs)
	}
	tw.Flush()
}

// printMemoryBench prints Go benchmark lines, so benchstat compares runs.
func printMemoryBench(w io.Writer, reps []openloop.MemoryReport) {
	fmt.Fprintf(w, "pkg: github.com/kvradix/kvradix/cmd/loadgen\n")
	for _, r := range reps {
		fmt.Fprintf(w, "BenchmarkMemory/%v 1 %.2f B/membership %.2f B/unique-block %d peak-B\n",
			shardpool.Impl{Name: r.Index, Lanes: r.Lanes}, r.TimeAvgBytesPerMembership, r.TimeAvgBytesPerUniqueBlock, r.PeakBackendBytes)
	}
}
