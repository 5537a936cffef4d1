package radix

import (
	"cmp"
	"slices"

	"github.com/kvradix/kvradix/kvevent"
)

func compareWorkers(a, b kvevent.Worker) int {
	if c := cmp.Compare(a.ID, b.ID); c != 0 {
		return c
	}
	return cmp.Compare(a.DPRank, b.DPRank)
}

// dumper turns held (worker, node) pairs, visited parents before children,
// into the events that rebuild them. It is shared by every index; N is the
// index's node identity.
type dumper[N comparable] struct {
	root   N
	key    func(N) uint64 // tokens hash of a node
	parent func(N) N
	held   map[kvevent.Worker]map[N]uint64   // the smallest engine hash naming each held node
	extra  map[kvevent.Worker]map[N][]uint64 // further aliases, sorted (rare)

	owns func(w kvevent.Worker, h uint64) bool // whether w names a node h in the index
	// tiers, if set, returns the tiers in which w holds what h names (nil:
	// the device only).
	tiers func(w kvevent.Worker, h uint64) kvevent.TierSet

	placeholders map[kvevent.Worker]map[N]uint64
	removals     []kvevent.RouterEvent
	nextHash     uint64                    // counts down: placeholders never share a hash
	yield        func(kvevent.RouterEvent) // hears every event, in order
	n            uint64                    // events yielded so far
}

// emit appends the Stored events of w holding n, one per alias. The parent
// of n must be the root, held by w, or given a placeholder first (a hole: w
// left it).
func (d *dumper[N]) emit(w kvevent.Worker, n N) {
	ph, has := d.parentHash(w, d.parent(n))
	d.storeTiers(w, ph, has, kvevent.StoredBlock{BlockHash: d.held[w][n], TokensHash: d.key(n)})
	for _, h := range d.extra[w][n] {
		d.storeTiers(w, ph, has, kvevent.StoredBlock{BlockHash: h, TokensHash: d.key(n)})
	}
}

// storeTiers stores blk once per tier w holds it in.
func (d *dumper[N]) storeTiers(w kvevent.Worker, parent uint64, hasParent bool, blk kvevent.StoredBlock) {
	if d.tiers == nil {
		d.store(w, parent, hasParent, blk, kvevent.TierDevice)
		return
	}
	tiers := d.tiers(w, blk.BlockHash)
	for _, t := range kvevent.Tiers {
		if tiers.Has(t) {
			d.store(w, parent, hasParent, blk, t)
		}
	}
}

// addHeld records that engine hash h of w names node n.
func (d *dumper[N]) addHeld(w kvevent.Worker, n N, h uint64) {
	if d.held == nil {
		d.held, d.extra = map[kvevent.Worker]map[N]uint64{}, map[kvevent.Worker]map[N][]uint64{}
	}
	m := d.held[w]
	if m == nil {
		m = map[N]uint64{}
		d.held[w] = m
	}
	first, ok := m[n]
	if !ok {
		m[n] = h
		return
	}
	if h < first {
		m[n], h = h, first
	}
	x := d.extra[w]
	if x == nil {
		x = map[N][]uint64{}
		d.extra[w] = x
	}
	hs := x[n]
	i, _ := slices.BinarySearch(hs, h)
	x[n] = slices.Insert(hs, i, h)
}

// parentHash returns how w names p in a Stored event: nothing for the root,
// its engine hash if held, else a placeholder stored now (recursively).
func (d *dumper[N]) parentHash(w kvevent.Worker, p N) (uint64, bool) {
	if p == d.root {
		return 0, false
	}
	if h, ok := d.held[w][p]; ok {
		return h, true
	}
	if h, ok := d.placeholders[w][p]; ok {
		return h, true
	}
	ph, has := d.parentHash(w, d.parent(p))
	h := d.freshHash(w)
	if d.placeholders == nil {
		d.placeholders = map[kvevent.Worker]map[N]uint64{}
	}
	if d.placeholders[w] == nil {
		d.placeholders[w] = map[N]uint64{}
	}
	d.placeholders[w][p] = h
	d.store(w, ph, has, kvevent.StoredBlock{BlockHash: h, TokensHash: d.key(p)}, kvevent.TierDevice)
	d.removals = append(d.removals, kvevent.RouterEvent{
		WorkerID: w.ID,
		Event:    kvevent.Event{DPRank: w.DPRank, Data: kvevent.Removed{BlockHashes: []uint64{h}}},
	})
	return h, true
}

// freshHash returns an engine hash w uses for nothing else. It asks the
// index rather than keeping a set of w's hashes: a dump of a large index
// should not hold a second copy of its tables.
func (d *dumper[N]) freshHash(w kvevent.Worker) uint64 {
	for {
		d.nextHash--
		if !d.owns(w, d.nextHash) {
			return d.nextHash
		}
	}
}

func (d *dumper[N]) store(w kvevent.Worker, parent uint64, hasParent bool, blk kvevent.StoredBlock, tier kvevent.Tier) {
	d.emitEvent(kvevent.RouterEvent{
		WorkerID: w.ID,
		Tier:     tier,
		Event: kvevent.Event{DPRank: w.DPRank, Data: kvevent.Stored{
			HasParent: hasParent, ParentHash: parent, Blocks: []kvevent.StoredBlock{blk},
		}},
	})
}

// emitEvent numbers ev and yields it.
func (d *dumper[N]) emitEvent(ev kvevent.RouterEvent) {
	ev.Event.ID = d.n
	d.n++
	d.yield(ev)
}

// finish yields the placeholder removals, last.
func (d *dumper[N]) finish() {
	for _, ev := range d.removals {
		d.emitEvent(ev)
	}
}

// heldAt is a node n held by worker w, n's depth below the root.
type heldAt struct {
	w     kvevent.Worker
	n     uint64
	depth uint32
}

// dumpByDepth is the dump of an index whose nodes are uint64 keys and
// which cannot walk its tree parents first: each calls add with every
// (worker, engine hash, node) it holds, and the nodes are emitted sorted by
// depth, then node, then worker, so that parents come first and the order
// is deterministic. d's key, parent and owns must be set.
func dumpByDepth(d *dumper[uint64], each func(add func(w kvevent.Worker, h, n uint64)), depth func(n uint64) uint32) {
	var pairs []heldAt
	each(func(w kvevent.Worker, h, n uint64) {
		if _, seen := d.held[w][n]; !seen {
			pairs = append(pairs, heldAt{w, n, depth(n)})
		}
		d.addHeld(w, n, h)
	})
	slices.SortFunc(pairs, func(a, b heldAt) int {
		return cmp.Or(cmp.Compare(a.depth, b.depth), cmp.Compare(a.n, b.n), compareWorkers(a.w, b.w))
	})
	for _, p := range pairs {
		d.emit(p.w, p.n)
	}
	d.finish()
}

// collect returns what dump yields, as a slice.
func collect(dump func(yield func(kvevent.RouterEvent))) []kvevent.RouterEvent {
	var out []kvevent.RouterEvent
	dump(func(ev kvevent.RouterEvent) { out = append(out, ev) })
	return out
}

// DumpEach calls yield with the events idx.Dump would return, in order,
// without holding them all: for dumping large indexes. Indexes of this
// package stream; others fall back to Dump.
func DumpEach(idx Index, yield func(kvevent.RouterEvent)) {
	if s, ok := idx.(interface {
		dumpEach(func(kvevent.RouterEvent))
	}); ok {
		s.dumpEach(yield)
		return
	}
	for _, ev := range idx.Dump() {
		yield(ev)
	}
}
