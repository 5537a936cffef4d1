package bench

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkRandomReads calibrates a machine for the store benchmarks:
// independent random 8-byte reads from a 64 MiB table (one cache line
// each, as a store's claim of a new block in the engine-hash table), by
// one goroutine or by goroutines=N each reading its share. ns/read is per
// read of the whole set: how much a second core adds to the random-access
// throughput bounds how much a second writer can add to a store dominated
// by such accesses.
func BenchmarkRandomReads(b *testing.B) {
	table := make([]uint64, 1<<23)
	for i := range table {
		table[i] = uint64(i)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	idx := make([]uint32, 4<<20)
	for i := range idx {
		idx[i] = uint32(rng.IntN(len(table)))
	}
	for _, g := range []int{1, 2} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			var sink atomic.Uint64
			for b.Loop() {
				var wg sync.WaitGroup
				share := len(idx) / g
				for w := range g {
					wg.Go(func() {
						var s uint64
						for _, i := range idx[w*share : (w+1)*share] {
							s += table[i]
						}
						sink.Add(s)
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(idx)), "ns/read")
		})
	}
}
