package radix

import (
	"math/rand/v2"
	"testing"
)

// TestEngineTable drives the table and a Go map with the same random
// inserts, moves and deletions over a small key space (long probe chains,
// wrap-around, growth and shrinking) and compares them after every op.
func TestEngineTable(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 9))
		var tab engineTable
		want := map[uint64]uint64{}
		keys := 1 + r.IntN(300)
		for step := range 5000 {
			h := uint64(r.IntN(keys))
			if r.IntN(3) > 0 {
				e, existed := tab.slot(h)
				_, had := want[h]
				if existed != had {
					t.Fatalf("seed %d step %d: slot(%d) existed %v, want %v", seed, step, h, existed, had)
				}
				loc := uint64(step+1) << 32
				e.loc, want[h] = loc, loc
			} else {
				loc, ok := tab.del(h)
				if w, had := want[h]; ok != had || loc != w {
					t.Fatalf("seed %d step %d: del(%d) = %d %v, want %d %v", seed, step, h, loc, ok, w, had)
				}
				delete(want, h)
			}
			if tab.len() != len(want) {
				t.Fatalf("seed %d step %d: len %d, want %d", seed, step, tab.len(), len(want))
			}
			if step%50 == 0 {
				for k, v := range want {
					if got, ok := tab.get(k); !ok || got != v {
						t.Fatalf("seed %d step %d: get(%d) = %d %v, want %d", seed, step, k, got, ok, v)
					}
				}
				n := 0
				tab.each(func(uint64, uint64) { n++ })
				if n != len(want) {
					t.Fatalf("seed %d step %d: each saw %d", seed, step, n)
				}
			}
		}
		for k := range want {
			tab.del(k)
		}
		if tab.e != nil || tab.len() != 0 {
			t.Fatalf("seed %d: %d slots left after deleting everything", seed, len(tab.e))
		}
	}
}
