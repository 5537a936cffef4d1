package radix

import (
	"math/bits"
	"sync"

	"github.com/kvradix/kvradix/kvevent"
)

// engineTable maps a worker's engine block hashes to where the block lives
// in a CompressedTree (a packed run id and offset, never 0). It is an
// open-addressing table of 16-byte entries with linear probing and
// backward-shift deletion (no tombstones): a probe is one cache line where a
// Go map touches a control word and a slot in separate places. Its length
// is any integer (a hash maps to its home slot by multiply-shift, not a
// mask), so it grows by half rather than doubling: memory per entry stays
// between 16/(7/8) and 16/(7/12) bytes, where doubling would swing to 16/(7/16).
// The zero value is an empty table. Not safe for concurrent use.
type engineTable struct {
	e    []engineEntry
	n    int
	sink uint64 // where warm's loads go, so that they are not optimised away
}

// engineEntry is one slot; loc == 0 marks it empty.
type engineEntry struct{ hash, loc uint64 }

// Load bounds: grow past 7/8 full (linear probes over 16-byte entries stay
// within a few cache lines), shrink below 1/4 so that a worker that evicts
// most of its blocks gives the memory back.
const (
	engineMinLen  = 8
	engineGrowNum = 7
	engineGrowDen = 8
)

// home maps h to its first slot: Fibonacci-mix the hash (engine hashes in
// tests are small integers), then scale its high bits to the length.
func (t *engineTable) home(h uint64) int {
	hi, _ := bits.Mul64(h*0x9E3779B97F4A7C15, uint64(len(t.e)))
	return int(hi)
}

func (t *engineTable) step(i int) int {
	if i++; i == len(t.e) {
		return 0
	}
	return i
}

// get returns the location of engine hash h.
func (t *engineTable) get(h uint64) (uint64, bool) {
	if t.n == 0 {
		return 0, false
	}
	for i := t.home(h); ; i = t.step(i) {
		e := &t.e[i]
		if e.loc == 0 {
			return 0, false
		}
		if e.hash == h {
			return e.loc, true
		}
	}
}

// slot returns the entry of h, inserting it if absent (with a placeholder
// loc); the caller must set its loc, or delete h again.
func (t *engineTable) slot(h uint64) (e *engineEntry, existed bool) {
	if (t.n+1)*engineGrowDen > len(t.e)*engineGrowNum {
		t.resize(max(engineMinLen, len(t.e)+len(t.e)/2))
	}
	for i := t.home(h); ; i = t.step(i) {
		e := &t.e[i]
		if e.loc == 0 {
			e.hash, e.loc = h, placeholderLoc
			t.n++
			return e, false
		}
		if e.hash == h {
			return e, true
		}
	}
}

// placeholderLoc marks an entry inserted by slot and not yet given a
// location; run ids start at 1, so every real location is at least 1<<32.
const placeholderLoc = 1

// del removes h and returns its location.
func (t *engineTable) del(h uint64) (uint64, bool) {
	if t.n == 0 {
		return 0, false
	}
	i := t.home(h)
	for ; ; i = t.step(i) {
		if t.e[i].loc == 0 {
			return 0, false
		}
		if t.e[i].hash == h {
			break
		}
	}
	loc := t.e[i].loc
	// Backward shift: move later entries of the probe run into the hole
	// unless that would put them before their home slot.
	size := len(t.e)
	for j := t.step(i); t.e[j].loc != 0; j = t.step(j) {
		if home := t.home(t.e[j].hash); (j-home+size)%size >= (j-i+size)%size {
			t.e[i] = t.e[j]
			i = j
		}
	}
	t.e[i] = engineEntry{}
	t.n--
	if t.n == 0 {
		recycleEntries(t.e)
		*t = engineTable{}
	} else if len(t.e) > engineMinLen && t.n*4 < len(t.e) {
		t.resize(len(t.e) / 2)
	}
	return loc, true
}

func (t *engineTable) resize(size int) {
	old := t.e
	t.e = newEntries(size)
	defer recycleEntries(old)
	for _, e := range old {
		if e.loc == 0 {
			continue
		}
		i := t.home(e.hash)
		for t.e[i].loc != 0 {
			i = t.step(i)
		}
		t.e[i] = e
	}
}

// warm loads the home slots of the blocks' engine hashes, so that the cache
// misses of a run of inserts overlap instead of each waiting for its own.
func (t *engineTable) warm(blocks []kvevent.StoredBlock) {
	if len(t.e) == 0 {
		return
	}
	var x uint64
	for i := range blocks {
		x += t.e[t.home(blocks[i].BlockHash)].loc
	}
	t.sink = x
}

// len returns the number of entries.
func (t *engineTable) len() int { return t.n }

// each calls fn for every entry. fn must not modify the table.
func (t *engineTable) each(fn func(h, loc uint64)) {
	for _, e := range t.e {
		if e.loc != 0 {
			fn(e.hash, e.loc)
		}
	}
}

// Tables of every worker grow through the same lengths (8, 12, 18, ...),
// so the array one worker outgrows is the one the next worker grows into.
// entryArrays keeps outgrown arrays by length for that: reusing one costs a
// clear of memory already mapped, where a fresh one costs a page fault per
// 4 KiB on first touch (a third of a store's time in a VM, measured in
// results/store-profile.txt). sync.Pool lets the collector drop what is not
// reused within two cycles.
var entryArrays sync.Map // length -> *sync.Pool of *[]engineEntry

// newEntries returns a zeroed array of size entries, recycled if one is at
// hand.
func newEntries(size int) []engineEntry {
	if p, ok := entryArrays.Load(size); ok {
		if a, _ := p.(*sync.Pool).Get().(*[]engineEntry); a != nil {
			clear(*a)
			return *a
		}
	}
	return make([]engineEntry, size)
}

// recycleEntries hands an array no table uses any more to newEntries.
// Small arrays are not worth a pool's bookkeeping.
func recycleEntries(a []engineEntry) {
	if len(a) < recycleMinLen {
		return
	}
	p, ok := entryArrays.Load(len(a))
	if !ok {
		p, _ = entryArrays.LoadOrStore(len(a), &sync.Pool{})
	}
	p.(*sync.Pool).Put(&a)
}

// recycleMinLen is the smallest array recycled: 16 KiB.
const recycleMinLen = 1024
