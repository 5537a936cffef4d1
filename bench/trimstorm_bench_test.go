package bench

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// BenchmarkTrimStorm measures a lock-free reader's latency while one worker
// trims the run it reads over and over: holders workers hold a run of 4
// blocks, the trimmer holds them too and stores and removes a fifth block
// at rate trims a second (each removal trims the run, each store regrows
// it), and the reader asks AppendMatches of all 5 blocks. A reader that
// keeps seeing the run's version move retries; the trimmer paces itself by
// spinning on the clock, so it takes a core of its own. p50-ns and p99-ns
// are the reader's per-query latencies; trims/s the rate achieved. The
// reader retries more the more trims it meets, so two trees' readers
// compare at the same achieved rate: trims=40000, which a trimmer kept to
// before the table's purges (39,000 a second at 10,000 holders), as well
// as trims=100000.
func BenchmarkTrimStorm(b *testing.B) {
	for _, holders := range []int{100, 10_000} {
		for _, rate := range []int{0, 40_000, 100_000} {
			b.Run(fmt.Sprintf("holders=%d/trims=%d", holders, rate), func(b *testing.B) {
				trimStorm(b, holders, rate)
			})
		}
	}
}

func trimStorm(b *testing.B, holders, rate int) {
	c := radix.NewCompressedTree()
	for i := range holders {
		if err := c.Apply(chain(kvevent.Worker{ID: kvevent.WorkerID(i)}, 0, false, 0, 4, tokensHash)); err != nil {
			b.Fatal(err)
		}
	}
	trimmer := kvevent.Worker{ID: kvevent.WorkerID(holders)}
	if err := c.Apply(chain(trimmer, 0, false, 0, 4, tokensHash)); err != nil {
		b.Fatal(err)
	}
	grow := chain(trimmer, 3, true, 4, 1, func(int) uint64 { return tokensHash(4) })
	trim := removal(grow)
	var stop atomic.Bool
	var trims atomic.Int64
	var wg sync.WaitGroup
	if rate > 0 {
		wg.Go(func() {
			every := time.Second / time.Duration(rate)
			next := time.Now()
			for !stop.Load() {
				if now := time.Now(); now.Before(next) {
					continue
				}
				next = next.Add(every)
				if c.Apply(grow) != nil || c.Apply(trim) != nil {
					panic("trim storm: event refused")
				}
				trims.Add(1)
			}
		})
	}
	q := make([]uint64, 5)
	for i := range q {
		q[i] = tokensHash(i)
	}
	var dst []radix.Match
	lat := make([]time.Duration, 0, 1<<16)
	start := time.Now()
	for b.Loop() {
		t0 := time.Now()
		dst = c.AppendMatches(dst[:0], q, false)
		lat = append(lat, time.Since(t0))
		if len(dst) < holders {
			b.Fatalf("%d matches, want at least %d", len(dst), holders)
		}
	}
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(trims.Load())/elapsed.Seconds(), "trims/s")
}
