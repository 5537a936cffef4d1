package bench

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvradix/kvradix/hashing"
)

// BenchmarkHashing is block hashing in tokens/s: impl=raw is XXH3 over the
// same bytes block by block (the ceiling), impl=xxh3 and impl=xxh64 are
// hashing.LocalHashes with each algorithm.
func BenchmarkHashing(b *testing.B) {
	for _, bs := range []int{16, 64} {
		for _, n := range []int{1024, 16384} {
			tokens := make([]uint32, n)
			raw := make([]byte, 0, 4*n)
			for i := range tokens {
				tokens[i] = uint32(i * 7919 % 128000)
				raw = binary.LittleEndian.AppendUint32(raw, tokens[i])
			}
			dst := make([]uint64, 0, n/bs)
			report := func(b *testing.B) {
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			}
			b.Run(fmt.Sprintf("impl=raw/block=%d/tokens=%d", bs, n), func(b *testing.B) {
				b.ReportAllocs()
				var sink uint64
				for b.Loop() {
					for i := 0; i < len(raw); i += 4 * bs {
						sink ^= xxh3.HashSeed(raw[i:i+4*bs], hashing.Seed)
					}
				}
				_ = sink
				report(b)
			})
			for _, alg := range []hashing.Algorithm{hashing.XXH3, hashing.XXH64} {
				b.Run(fmt.Sprintf("impl=%v/block=%d/tokens=%d", alg, bs, n), func(b *testing.B) {
					b.ReportAllocs()
					opts := hashing.Options{Algorithm: alg}
					for b.Loop() {
						dst = hashing.LocalHashes(dst[:0], tokens, bs, opts)
					}
					report(b)
				})
			}
		}
	}
}
