package prefetch

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// Write is a hint: it changes no word, wherever it points (the first and
// last words of an allocation, words other goroutines swap meanwhile).
func TestWriteChangesNothing(t *testing.T) {
	ws := make([]uint64, 1<<12)
	for i := range ws {
		ws[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1 << 16 {
			for {
				v := atomic.LoadUint64(&ws[1])
				if atomic.CompareAndSwapUint64(&ws[1], v, v+1) {
					break
				}
			}
		}
	}()
	for range 1 << 16 {
		Write(&ws[1])
	}
	<-done
	Write(&ws[0])
	Write(&ws[len(ws)-1])
	for i := range ws {
		Write(&ws[i])
	}
	if got := atomic.LoadUint64(&ws[1]); got != 0x9E3779B97F4A7C15+1<<16 {
		t.Errorf("word 1 = %#x after 2^16 increments, want %#x", got, uint64(0x9E3779B97F4A7C15+1<<16))
	}
	for i := range ws {
		if i != 1 && ws[i] != uint64(i)*0x9E3779B97F4A7C15 {
			t.Fatalf("word %d = %#x, want %#x", i, ws[i], uint64(i)*0x9E3779B97F4A7C15)
		}
	}
}

// BenchmarkSwaps is compare-and-swaps of random words of a 64 MiB table,
// each line asked for ahead=8 swaps ahead: by a load, by Write, or not at
// all. What it shows is why the engine-hash table's claims use Write.
func BenchmarkSwaps(b *testing.B) {
	table := make([]uint64, 8<<20)
	for i := range table {
		table[i] = uint64(i) // resident before the first figure
	}
	idx := make([]uint32, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range idx {
		idx[i] = uint32(rng.IntN(len(table)))
	}
	const ahead = 8
	for _, how := range []string{"none", "load", "write"} {
		b.Run("ahead="+how, func(b *testing.B) {
			var sink uint64
			for b.Loop() {
				for i, j := range idx {
					if k := i + ahead; k < len(idx) {
						switch how {
						case "load":
							sink += atomic.LoadUint64(&table[idx[k]])
						case "write":
							Write(&table[idx[k]])
						}
					}
					v := atomic.LoadUint64(&table[j])
					atomic.CompareAndSwapUint64(&table[j], v, v+1)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(idx)), "ns/swap")
			_ = sink
		})
	}
}
