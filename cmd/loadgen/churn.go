package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/openloop"
	"github.com/kvradix/kvradix/shardpool"
)

// churnPass is what one pass of the soak left behind.
type churnPass struct {
	Pass      int     `json:"pass"`
	Ops       int     `json:"ops"`
	Left      int     `json:"workers_left"`     // RemoveWorker calls mid-pass
	Rejected  uint64  `json:"rejected_events"`  // events of workers that had left (expected)
	PairsPeak int     `json:"pairs_peak"`       // pairs before everyone left
	PairsEnd  int     `json:"pairs_end"`        // pairs after everyone left (must be 0)
	HeapMB    float64 `json:"heap_mb_after_gc"` // live heap after everyone left
}

type churnResult struct {
	Impl    string      `json:"impl"`
	Lanes   int         `json:"lanes"`
	Passes  []churnPass `json:"passes"`
	HeapMB  []float64   `json:"heap_mb_each_second"`
	Verdict string      `json:"verdict"` // "flat" or "growing"
}

// churnSoak replays the timeline in passes for the whole window, against
// one indexer: during a pass, a random tenth of the workers leave
// (RemoveWorker) at each tenth of the ops and rejoin with their next
// events; at the end of a pass every worker leaves. The live heap after
// each pass must stay flat: what departed workers held comes back.
func churnSoak(c *openloop.Corpus, im shardpool.Impl, window time.Duration, stopped *interrupt, progress io.Writer) churnResult {
	blockSize, workers := int(c.BlockSize), int(c.LogicalWorkers)
	idx := im.New(blockSize)
	defer idx.Close()
	res := churnResult{Impl: im.Name, Lanes: im.Lanes}
	stop := make(chan struct{})
	sampled := make(chan []float64)
	go func() { sampled <- sampleHeap(stop, progress) }()
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	for pass := 1; pass <= 2 || time.Since(start) < window; pass++ {
		if stopped.Load() {
			break
		}
		p := churnPass{Pass: pass}
		before := idx.Stats().Rejected()
		tenth := max(1, len(c.Ops)/10)
		for i := range c.Ops {
			op := &c.Ops[i]
			if i%tenth == tenth-1 {
				for range workers / 10 {
					_ = idx.RemoveWorker(kvevent.WorkerID(rng.IntN(workers)))
					p.Left++
				}
			}
			if op.IsQuery() {
				_, _ = idx.FindMatches(op.Query)
			} else {
				_ = idx.ApplyEvent(kvevent.RouterEvent{WorkerID: op.Worker, Event: op.Event})
			}
			p.Ops++
			if stopped.Load() {
				break
			}
		}
		_, _ = idx.Flush()
		p.PairsPeak = idx.Stats().Pairs
		for w := range workers {
			_ = idx.RemoveWorker(kvevent.WorkerID(w))
		}
		_, _ = idx.Flush()
		st := idx.Stats()
		p.Rejected, p.PairsEnd = st.Rejected()-before, st.Pairs
		p.HeapMB = liveHeapMB()
		fmt.Fprintf(progress, "%v pass %d: %d ops, %d left mid-pass, peak %d pairs, %d after all left, heap %.1f MB\n",
			im, pass, p.Ops, p.Left, p.PairsPeak, p.PairsEnd, p.HeapMB)
		res.Passes = append(res.Passes, p)
	}
	close(stop)
	res.HeapMB = <-sampled
	res.Verdict = heapVerdict(res.Passes)
	return res
}

// heapVerdict is "flat" when no pass after the first ends with more live
// heap than the first did, give or take 10% and 4 MB (the GC's slack),
// and every pass ended empty.
func heapVerdict(passes []churnPass) string {
	if len(passes) == 0 {
		return "no pass"
	}
	for _, p := range passes {
		if p.PairsEnd != 0 || p.HeapMB > passes[0].HeapMB*1.1+4 {
			return "growing"
		}
	}
	return "flat"
}

// sampleHeap records the heap in use each second until stop.
func sampleHeap(stop <-chan struct{}, progress io.Writer) []float64 {
	var out []float64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return out
		case <-tick.C:
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			out = append(out, float64(ms.HeapAlloc)/(1<<20))
			fmt.Fprintf(progress, "heap %.1f MB\n", out[len(out)-1])
		}
	}
}

func liveHeapMB() float64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

func printChurn(w io.Writer, results []churnResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "index\tpass\tops\tleft mid-pass\trejected\tpeak pairs\tpairs after\theap after (MB)\t")
	for _, r := range results {
		step := max(1, len(r.Passes)/8) // the first, every step-th and the last pass
		for i, p := range r.Passes {
			if i%step != 0 && i != len(r.Passes)-1 {
				continue
			}
			fmt.Fprintf(tw, "%v\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f\t\n", shardpool.Impl{Name: r.Impl, Lanes: r.Lanes}, p.Pass, p.Ops, p.Left, p.Rejected, p.PairsPeak, p.PairsEnd, p.HeapMB)
		}
	}
	tw.Flush()
	for _, r := range results {
		lo, hi := 0.0, 0.0
		if len(r.HeapMB) > 0 {
			lo, hi = slices.Min(r.HeapMB), slices.Max(r.HeapMB)
		}
		fmt.Fprintf(w, "%v: heap sampled each second %.1f-%.1f MB over %d s; verdict: %s\n",
			shardpool.Impl{Name: r.Impl, Lanes: r.Lanes}, lo, hi, len(r.HeapMB), r.Verdict)
	}
}
