package bench

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/openloop"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/trace"
)

// corpusBatch is the most events one ApplyBatch takes, as a pool lane's
// batch (shardpool drains up to that many queued events at once).
const corpusBatch = 64

// BenchmarkCorpus is the field benchmark's work without its clock: the
// operations of the SMGMCK01 corpus at the scaled standard settings
// (`loadgen indexer -dup 2 -length-factor 4`: 128 engines of 16,384
// blocks of 128 tokens, two copies, 22.0M block operations) applied in
// issue order to a fresh CompressedTree sized for the engines' pools
// summed, as `-sized` builds it: events in batches of consecutive events,
// lookups through AppendMatches. Nothing waits and nothing else runs, so
// ns/block-op is the index's own cost of the work the field's figure
// divides (1e9 / ns/block-op is the block operations a lane core could
// sustain with no harness at all). ops=events leaves the lookups out: the
// stores' and removals' cost alone. writers=2 splits the events between
// two goroutines by worker, as two pool lanes would, each in issue order:
// against writers=1 at the same GOMAXPROCS, what a second writer adds on
// the field's workload. Building the tree (its table made resident) is
// not timed.
func BenchmarkCorpus(b *testing.B) {
	cp, tot := scaledCorpus(b)
	for _, c := range []struct {
		ops     string
		writers int
	}{{"all", 1}, {"events", 1}, {"events", 2}} {
		b.Run(fmt.Sprintf("ops=%s/writers=%d", c.ops, c.writers), func(b *testing.B) {
			blockOps := tot.StoredBlocks + tot.RemovedBlocks
			if c.ops == "all" {
				blockOps += tot.RequestBlocks
			}
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				t := radix.NewCompressedTreeSized(int(cp.LogicalWorkers) * scaledBlocks)
				runtime.GC()
				b.StartTimer()
				errs := make([]error, c.writers)
				var wg sync.WaitGroup
				for g := range c.writers {
					wg.Go(func() { errs[g] = applyCorpus(t, cp, c.ops == "all", c.writers, g) })
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blockOps), "ns/block-op")
		})
	}
}

// applyCorpus applies to t, in order, cp's events of the workers w with w
// mod writers = g, and its lookups if queries. Errors are the corpus's,
// never expected.
func applyCorpus(t *radix.CompressedTree, cp *openloop.Corpus, queries bool, writers, g int) error {
	var (
		batch []kvevent.RouterEvent
		errs  [corpusBatch]error
		dst   []radix.Match
	)
	flush := func() error {
		n := len(batch)
		t.ApplyBatch(batch, errs[:n])
		batch = batch[:0]
		return errors.Join(errs[:n]...)
	}
	for i := range cp.Ops {
		o := &cp.Ops[i]
		if !o.IsQuery() {
			if int(o.Worker)%writers != g {
				continue
			}
			if batch = append(batch, kvevent.RouterEvent{WorkerID: o.Worker, Event: o.Event}); len(batch) == corpusBatch {
				if err := flush(); err != nil {
					return err
				}
			}
			continue
		}
		if !queries {
			continue
		}
		if err := flush(); err != nil {
			return err
		}
		dst = t.AppendMatches(dst[:0], o.Query, false)
	}
	return flush()
}

// scaledBlocks is the corpus's blocks per engine.
const scaledBlocks = 16384

var scaled struct {
	once sync.Once
	cp   *openloop.Corpus
	err  error
}

// scaledCorpus builds the scaled standard corpus once per process (about
// 10 s here).
func scaledCorpus(b *testing.B) (*openloop.Corpus, openloop.Totals) {
	b.Helper()
	scaled.once.Do(func() {
		reqs, err := trace.ReadAll(trace.Default())
		if err != nil {
			scaled.err = err
			return
		}
		cfg := openloop.BuildConfig{Trace: "mooncake-conversation", Workers: 128, BlockSize: 128,
			TraceBlockSize: trace.TraceBlockSize, Blocks: scaledBlocks, Dup: 2, LengthFactor: 4}
		scaled.cp, scaled.err = openloop.Build(reqs, cfg, time.Second)
	})
	if scaled.err != nil {
		b.Fatal(fmt.Errorf("building the corpus: %w", scaled.err))
	}
	return scaled.cp, scaled.cp.Totals()
}
