package radixtest_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
)

// Holdings agree with the Model's verdicts: equal indexes are equal, and
// a different path, alias or worker shows.
func TestHoldings(t *testing.T) {
	w := kvevent.Worker{ID: 1}
	build := func(evs ...kvevent.RouterEvent) radix.Index {
		tr := radix.NewTree()
		for _, ev := range evs {
			_ = tr.Apply(ev)
		}
		return tr
	}
	base := []kvevent.RouterEvent{radixtest.Stored(w, -1, 10, 1, 11, 2), radixtest.Stored(w, 10, 12, 3), radixtest.Removed(w, 11)}
	a, err := radixtest.HoldingsOf(build(base...))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := radixtest.HoldingsOf(build(base...))
	if d := a.Diff(b); d != "" {
		t.Fatalf("equal indexes differ: %s", d)
	}
	for name, other := range map[string][]kvevent.RouterEvent{
		"another path":   {radixtest.Stored(w, -1, 10, 1, 11, 2), radixtest.Stored(w, 10, 12, 4), radixtest.Removed(w, 11)},
		"an alias":       append(append([]kvevent.RouterEvent{}, base...), radixtest.Stored(w, -1, 13, 1)),
		"another rank":   {radixtest.Stored(kvevent.Worker{ID: 1, DPRank: 1}, -1, 10, 1, 11, 2), radixtest.Stored(kvevent.Worker{ID: 1, DPRank: 1}, 10, 12, 3), radixtest.Removed(kvevent.Worker{ID: 1, DPRank: 1}, 11)},
		"nothing at all": nil,
	} {
		o, err := radixtest.HoldingsOf(build(other...))
		if err != nil {
			t.Fatal(err)
		}
		if a.Diff(o) == "" || o.Diff(a) == "" {
			t.Errorf("%s: no difference found", name)
		}
	}
}

// Holdings applied straight from an event stream equal the Holdings of a
// Tree fed the same stream: the same semantics, aliases and rejections
// included.
func TestHoldingsApplyMatchesTheTree(t *testing.T) {
	for seed := range uint64(20) {
		g := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, 1)), Model: radixtest.NewModel()}
		tr := radix.NewTree()
		h := radixtest.Holdings{}
		for range 400 {
			op := g.Next()
			if op.Kind != radixtest.OpEvent {
				continue
			}
			_ = g.Model.Apply(op.Event)
			_ = tr.Apply(op.Event)
			_ = h.Apply(op.Event)
		}
		want, err := radixtest.HoldingsOf(tr)
		if err != nil {
			t.Fatal(err)
		}
		if d := h.Diff(want); d != "" {
			t.Fatalf("seed %d: %s", seed, d)
		}
	}
}

// DiffIndex agrees with comparing HoldingsOf, on equal and unequal indexes
// (holes make the dump use placeholders, which must not count).
func TestHoldingsDiffIndex(t *testing.T) {
	differ := 0
	for seed := range uint64(20) {
		g := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, 9)), Model: radixtest.NewModel()}
		tr, other := radix.NewTree(), radix.NewCompressedTree()
		h := radixtest.Holdings{}
		for i := range 300 {
			op := g.Next()
			if op.Kind != radixtest.OpEvent {
				continue
			}
			_ = g.Model.Apply(op.Event)
			_ = tr.Apply(op.Event)
			_ = h.Apply(op.Event)
			if i != 150 { // other misses one event
				_ = other.Apply(op.Event)
			}
		}
		if d := h.DiffIndex(tr); d != "" {
			t.Fatalf("seed %d: equal index differs: %s", seed, d)
		}
		oh, _ := radixtest.HoldingsOf(other)
		if (h.DiffIndex(other) == "") != (h.Diff(oh) == "") {
			t.Fatalf("seed %d: DiffIndex %q, Diff %q", seed, h.DiffIndex(other), h.Diff(oh))
		}
		if h.Diff(oh) != "" {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("no seed made the indexes differ: the test checks nothing")
	}
}
