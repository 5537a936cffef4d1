package bench

import (
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// decodeSteps decodes each worker's last sequences in turn, each step
// under its sequence's last block, and returns none, without spinning, for
// requests that store no block.
func TestDecodeSteps(t *testing.T) {
	w := kvevent.Worker{ID: 7}
	tok := func(i int) uint64 { return uint64(100 + i) }
	prompt := chain(w, 0, false, 1, 3, tok)
	empty := chain(w, 0, false, 50, 0, tok)
	reqs := []shapedReq{{store: prompt, local: []uint64{100, 101, 102}}, {store: empty}}

	done := make(chan int)
	go func() {
		evs, paths := decodeSteps([]shapedReq{{store: empty}}, 2, 5)
		done <- len(evs) + len(paths)
	}()
	select {
	case n := <-done:
		if n != 0 {
			t.Fatalf("%d steps and paths for requests that store no block, want none", n)
		}
	case <-time.After(time.Minute):
		t.Fatal("decodeSteps still running after a minute, for requests that store no block")
	}

	evs, paths := decodeSteps(reqs, 2, 5)
	if len(evs) != 5 || len(paths) != 1 || len(paths[0]) != 3+5 {
		t.Fatalf("%d steps, paths %v: want 5 steps of the one sequence", len(evs), paths)
	}
	idx := radix.NewCompressedTree()
	for i, ev := range append([]kvevent.RouterEvent{prompt}, evs...) {
		if err := idx.Apply(ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if got := idx.FindMatches(paths[0], false).Scores[w]; got != 8 {
		t.Fatalf("the decoded path matches %d blocks, want 8", got)
	}
}
