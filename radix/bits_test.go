package radix

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSetClearBits checks setBits and clearBits against a bit at a time,
// over every range of a three-word bitset, from random words.
func TestSetClearBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for from := uint32(0); from <= 192; from++ {
		for to := from; to <= 192; to++ {
			ws := []uint64{rng.Uint64(), rng.Uint64(), rng.Uint64()}
			wantSet, wantClear := slices.Clone(ws), slices.Clone(ws)
			want := uint32(0)
			for p := from; p < to; p++ {
				if wantSet[p/64]&(1<<(p%64)) == 0 {
					want++
				}
				wantSet[p/64] |= 1 << (p % 64)
				wantClear[p/64] &^= 1 << (p % 64)
			}
			got := slices.Clone(ws)
			if n := setBits(got, from, to); n != want || !slices.Equal(got, wantSet) {
				t.Fatalf("setBits(%x, %d, %d) = %x, %d; want %x, %d", ws, from, to, got, n, wantSet, want)
			}
			got = slices.Clone(ws)
			if clearBits(got, from, to); !slices.Equal(got, wantClear) {
				t.Fatalf("clearBits(%x, %d, %d) = %x; want %x", ws, from, to, got, wantClear)
			}
		}
	}
}
