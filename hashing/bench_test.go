package hashing

import (
	"fmt"
	"testing"

	"github.com/zeebo/xxh3"
)

// BenchmarkLocalHashes compares LocalHashes with raw XXH3 over the same
// bytes, block by block, so the overhead of the API is visible directly.
func BenchmarkLocalHashes(b *testing.B) {
	for _, bs := range []int{16, 64} {
		for _, n := range []int{1024, 16384} {
			tokens := make([]uint32, n)
			for i := range tokens {
				tokens[i] = uint32(i * 7919)
			}
			dst := make([]uint64, 0, n/bs)
			b.Run(fmt.Sprintf("impl=raw/block=%d/tokens=%d", bs, n), func(b *testing.B) {
				raw := leBytes(tokens)
				var sink uint64
				for b.Loop() {
					for i := 0; i+4*bs <= len(raw); i += 4 * bs {
						sink += xxh3.HashSeed(raw[i:i+4*bs], Seed)
					}
				}
				_ = sink
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
			for _, alg := range []Algorithm{XXH3, XXH64} {
				b.Run(fmt.Sprintf("impl=%v/block=%d/tokens=%d", alg, bs, n), func(b *testing.B) {
					opts := Options{Algorithm: alg}
					for b.Loop() {
						dst = LocalHashes(dst[:0], tokens, bs, opts)
					}
					b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
				})
			}
		}
	}
}

func BenchmarkSequenceHashes(b *testing.B) {
	local := make([]uint64, 1024)
	for i := range local {
		local[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	dst := make([]uint64, 0, len(local))
	for b.Loop() {
		dst = SequenceHashes(dst[:0], local)
	}
	b.ReportMetric(float64(len(local))*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}
