package radix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/kvradix/kvradix/kvevent"
)

// testChain is a chainTable over blocks whose engine hashes are fixed in
// advance: block (id, off) has hash keys[id][off].
type testChain struct {
	chainTable
	keys [][]uint64
}

func newTestChain(runs, perRun int, hash func(id, off int) uint64) *testChain {
	c := &testChain{keys: make([][]uint64, runs+1)}
	for id := 1; id <= runs; id++ {
		c.keys[id] = make([]uint64, perRun)
		for off := range perRun {
			c.keys[id][off] = hash(id, off)
		}
	}
	c.init(func(loc uint64) (uint64, bool) {
		id, off := loc>>32, loc&(1<<32-1)
		if id == 0 || id >= uint64(len(c.keys)) || off >= uint64(len(c.keys[id])) {
			return 0, false
		}
		return c.keys[id][off], true
	})
	return c
}

func loc(id, off int) uint64 { return uint64(id)<<32 | uint64(off) }

// The table calls doubled, if set, each time its directory doubles and
// then only, with the segments it serves then: a grown table's doublings
// are what a grown tree warms its heap ahead at (warmAhead).
func TestChainTableDoubled(t *testing.T) {
	const runs, perRun = 32, maxRunLen
	rng := rand.New(rand.NewPCG(3, 4))
	c := newTestChain(runs, perRun, func(int, int) uint64 { return rng.Uint64() })
	var calls []int
	c.doubled = func(segs int) {
		if c.nsegs != segs {
			t.Errorf("doubled(%d) with %d segments", segs, c.nsegs)
		}
		calls = append(calls, int(c.dir.Load().depth))
	}
	for id := 1; id <= runs; id++ {
		for off := range perRun {
			c.claim(c.keys[id][off], loc(id, off))
		}
	}
	depth := int(c.dir.Load().depth)
	if depth < 4 {
		t.Fatalf("directory depth %d after %d claims, want 4 or more", depth, runs*perRun)
	}
	// One call a doubling, each one level deeper (the first doubling is
	// the first split, to depth 1).
	for i, d := range calls {
		if d != i+1 {
			t.Fatalf("doubled at depths %v, want 1 to %d in order", calls, depth)
		}
	}
	if len(calls) != depth {
		t.Fatalf("doubled %d times to depth %d", len(calls), depth)
	}
}

// A segment whose entries fill it (7/8 of its slots) splits in two small
// ones, small or full-size alike: a small one grows no longer to full size
// first, which copied each entry once more. A small one made to grow while
// its entries are under nearFull (tombstones filling the rest, or here a
// count run ahead, which claims recount first: TestChainTableRecount)
// grows to full size instead, at its depth, so that it neither splits
// early nor deepens the directory.
func TestChainTableGrowth(t *testing.T) {
	const runs, perRun = 2, maxRunLen
	rng := rand.New(rand.NewPCG(5, 6))
	c := newTestChain(runs, perRun, func(int, int) uint64 { return rng.Uint64() })
	fill := func(s *chainSeg, upTo int) {
		for id := 1; id <= runs; id++ {
			for off, h := range c.keys[id] {
				if id*perRun+off >= perRun+upTo {
					return
				}
				if _, ok := c.find(h); !ok {
					v, _ := c.encode(c.fingerprint(h), loc(id, off))
					c.put(s, v)
				}
			}
		}
	}
	check := func(step string, upTo int, want ...int) {
		t.Helper()
		var lens []int
		for _, s := range c.dir.Load().loaded() {
			lens = append(lens, len(s.slots))
		}
		if !slices.Equal(lens, want) {
			t.Fatalf("%s: segments of %v slots, want %v", step, lens, want)
		}
		for i := range upTo {
			id, off := 1+i/perRun, i%perRun
			if got, ok := c.find(c.keys[id][off]); !ok || got != loc(id, off) {
				t.Fatalf("%s: entry %d/%d lost", step, id, off)
			}
		}
	}
	grow := func(upTo int) {
		s := c.dir.Load().segs[0].Load()
		fill(s, upTo)
		if !c.grow(s) {
			t.Fatalf("%d entries: grow refused", upTo)
		}
	}
	ahead := (&chainSeg{slots: make([]uint64, segSmall)}).nearFull() - 1
	grow(ahead)
	check("a small segment, its count ahead", ahead, segSlots)
	grow(segMaxUsed)
	check("a full-size segment, full", segMaxUsed, segSmall, segSmall)
	if d := c.dir.Load(); d.depth != 1 {
		t.Fatalf("split to directory depth %d, want 1", d.depth)
	}
	c.init(c.keyOf)
	grow(segSmall * 7 / 8)
	check("a small segment, full", segSmall*7/8, segSmall, segSmall)
}

// A segment whose sampled count says it is full before it is (here, its
// first entries all of the ones the count counts) is recounted and left
// as it is, the count's lead recorded: it is reshaped only once its used
// slots are within 1/16 of its maxUsed, and then split in two, never grown
// first.
func TestChainTableRecount(t *testing.T) {
	const runs, perRun, skewed = 2, maxRunLen, 400
	rng := rand.New(rand.NewPCG(9, 10))
	c := newTestChain(runs, perRun, func(int, int) uint64 { return rng.Uint64() })
	for off := range skewed { // keys the count counts, each for countWeight
		for h := c.keys[1][off]; ; h = rng.Uint64() {
			if c.counted(c.fingerprint(h)) {
				c.keys[1][off] = h
				break
			}
		}
	}
	first := c.dir.Load().segs[0].Load()
	for i := range runs * perRun {
		id, off := 1+i/perRun, i%perRun
		if !c.claim(c.keys[id][off], loc(id, off)) {
			t.Fatalf("claim %d refused", i)
		}
		if s := c.dir.Load().segs[0].Load(); s != first {
			if i+1 < first.nearFull() {
				t.Fatalf("reshaped at %d entries, under the %d a small segment holds nearly full", i+1, first.nearFull())
			}
			if segs := distinct(c.dir.Load().loaded()); len(segs) != 2 || len(segs[0].slots) != segSmall || len(segs[1].slots) != segSmall {
				t.Fatalf("the first reshape, at %d entries, left %d segments, want a split in two small ones", i+1, len(segs))
			}
			return
		}
		if i == skewed-1 && first.ahead.Load() <= 0 {
			t.Fatalf("after %d counted entries (%d by the count), the count's lead is %d", skewed, used(first.count.Load()), first.ahead.Load())
		}
	}
	t.Fatal("never reshaped")
}

// checkReserveMoves reserves c, holding model's entries, for n: every
// entry is then found where it was, in a reserved directory as deep as n
// asks, whose homes are computed (checkHomeSlots), and reserving it again
// for no more, or fewer, does nothing.
func checkReserveMoves(t *testing.T, c *chainTable, n int, model map[uint64]uint64) {
	t.Helper()
	before := c.dir.Load().depth
	if !c.reserve(n) {
		t.Fatalf("reserve(%d) refused at directory depth %d", n, before)
	}
	d := c.dir.Load()
	if d.slab == nil || d.depth != reserveDepth(n) || d.depth < before || c.nsegs != len(d.segs) {
		t.Fatalf("after reserve(%d): depth %d (was %d, want %d), slab %v, %d segments counted of %d", n, d.depth, before, reserveDepth(n), d.slab != nil, c.nsegs, len(d.segs))
	}
	live := 0
	for _, s := range d.loaded() {
		live += countLive(s)
	}
	if live != len(model) {
		t.Fatalf("reserve moved %d entries of %d", live, len(model))
	}
	for h, l := range model {
		if got, ok := c.find(h); !ok || got != l {
			t.Fatalf("after reserve: find(%#x) = %#x %v, want %#x", h, got, ok, l)
		}
	}
	if c.reserve(n) || c.reserve(n/4) {
		t.Fatal("reserve for no more than the table holds resized it")
	}
}

// The table agrees with a map through claims, finds and releases that
// split segments many times and rebuild them after mass deletion, with
// hashes that share fingerprints (small integers and colliding ones);
// reserved for a part of them up front, or for all (splitting none), too;
// or reserved for 600,000 once it holds the first round's 262,144
// entries (reserve moving them into the new segments), where it then
// splits no more: filling it again after the mass deletion purges its
// segments of their tombstones instead (the colliding hashes all take
// one home there, their tombstones in one run: see maxTombs).
//
// The race detector takes minutes over the last (its atomics on the
// reserved table's slots, a second without it): it runs without
// the detector only, and TestConcurrentWritersOnManyWorkers resizes trees
// while their writers write under it.
func TestChainTableModel(t *testing.T) {
	for _, reserve := range []int{0, 40_000} {
		testChainTableModel(t, reserve, false)
	}
	if !raceEnabled {
		testChainTableModel(t, 600_000, true)
	}
}

func testChainTableModel(t *testing.T, reserve int, midway bool) {
	const runs, perRun = 64, maxRunLen
	rng := rand.New(rand.NewPCG(1, 2))
	c := newTestChain(runs, perRun, func(id, off int) uint64 {
		switch id % 3 {
		case 0:
			return uint64(id*perRun + off) // small integers
		case 1:
			return uint64(id*perRun+off) << 40 // the same low bits
		}
		return rng.Uint64()
	})
	if reserve > 0 && !midway {
		c.reserve(reserve)
	}
	model := map[uint64]uint64{} // hash -> block
	check := func(h uint64) {
		t.Helper()
		got, ok := c.find(h)
		want, wok := model[h]
		if ok != wok || got != want {
			t.Fatalf("find(%#x) = %#x %v, want %#x %v", h, got, ok, want, wok)
		}
	}
	for round := range 3 {
		for id := 1; id <= runs; id++ {
			for off := range perRun {
				h, l := c.keys[id][off], loc(id, off)
				owner, taken := model[h]
				if got := c.claim(h, l); got != (!taken || owner == l) {
					t.Fatalf("round %d: claim(%#x, %#x) = %v with the hash taken by %#x: %v", round, h, l, got, owner, taken)
				}
				if !taken {
					model[h] = l
				}
			}
		}
		if midway && round == 0 {
			checkReserveMoves(t, &c.chainTable, reserve, model)
		}
		if d := c.dir.Load(); midway && round == 1 && d.depth != reserveDepth(reserve) {
			t.Fatalf("the reserved table split, to depth %d, filling again", d.depth)
		}
		// A claim of a hash already claimed elsewhere fails; of the same
		// block again, succeeds.
		h := c.keys[5][7]
		if c.claim(h, loc(6, 9)) || !c.claim(h, model[h]) {
			t.Fatal("second claims")
		}
		for h, l := range model {
			if rng.IntN(10) < 9 || round == 2 {
				c.release(h, l)
				delete(model, h)
			}
			if other := loc(1, 1); l != other {
				c.release(h, other) // not its block: nothing
			}
		}
		for id := 1; id <= runs; id += 7 {
			for off := range perRun {
				check(c.keys[id][off])
			}
		}
	}
	if d := c.dir.Load(); d.depth < 6 {
		t.Fatalf("reserve %d: directory depth %d: the test did not split", reserve, d.depth)
	}

	checkHomeSlots(t, c, false)
	distinct := map[*chainSeg]bool{}
	for _, s := range c.dir.Load().loaded() {
		if n := countLive(s); n != 0 {
			t.Fatalf("a segment holds %d entries after every release", n)
		}
		distinct[s] = true
	}
	if len(distinct) > 1 {
		t.Fatalf("%d segments left after every release: not merged", len(distinct))
	}
}

// checkHomeSlots checks that homeSlot is the home slot a probe starts
// from, for hashes of every segment, computed (from the reserved slab) or
// not, as computed says.
func checkHomeSlots(t *testing.T, c *testChain, computed bool) {
	t.Helper()
	d := c.dir.Load()
	if (d.slab != nil) != computed {
		t.Fatalf("directory of depth %d has a slab: %v, want %v", d.depth, d.slab != nil, computed)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		h := rng.Uint64()
		fp, spare := c.hashBits(h)
		s := c.segment(fp)
		if got, want := c.homeSlot(h), &s.slots[s.home(fp, spare)]; got != want {
			t.Fatalf("homeSlot(%#x) is not the home slot of its segment (depth %d of %d)", h, s.depth, d.depth)
		}
	}
}

// A grown table's entries of one home share all of their fingerprint but
// the bits between the directory's and the home's: claims of random
// hashes, 500,000 of them (256 segments), read another block's hash
// (keyOf) about once in 4,500 claims at 30 bits of fingerprint, once in
// 1,000 at 28. More than once in 2,000 fails.
func TestChainTableGrownReads(t *testing.T) {
	const runs, perRun = 125, 4_000
	rng := rand.New(rand.NewPCG(7, 8))
	c := newTestChain(runs, perRun, func(int, int) uint64 { return rng.Uint64() })
	keyOf, reads := c.keyOf, 0
	c.keyOf = func(loc uint64) (uint64, bool) { reads++; return keyOf(loc) }
	for id := 1; id <= runs; id++ {
		for off, h := range c.keys[id] {
			if !c.claim(h, loc(id, off)) {
				t.Fatalf("claim %d/%d refused", id, off)
			}
		}
	}
	if d := c.dir.Load(); d.slab != nil || d.depth < 7 {
		t.Fatalf("directory depth %d, reserved %v: want a grown table of 128 segments or more", d.depth, d.slab != nil)
	}
	if n := runs * perRun; reads > n/2_000 {
		t.Fatalf("%d claims read %d other blocks' hashes, want at most one in 2,000", n, reads)
	}
}

// A reserved segment spreads hashes of one fingerprint over their spare
// bits: 2,000 of them, claimed into a table reserved for them, each find
// its home empty, so that no claim reads a block's hash (keyOf), where a
// home from the fingerprint would put them all on one and read every
// block claimed before (about two million reads). Each is found, reading
// its own block's hash once.
func TestChainTableSpareHomes(t *testing.T) {
	const n, fp = 2000, 0xABCDEF1
	c := newTestChain(1, n, func(_, off int) uint64 { return fibHash(fp, uint64(off)<<(64-fpBits-segBits)|0x5A5A5) })
	c.mult = fibMult // the fingerprints chosen
	keyOf, reads := c.keyOf, 0
	c.keyOf = func(loc uint64) (uint64, bool) { reads++; return keyOf(loc) }
	for c.counted(fp) {
		// Entries of one fingerprint all count or none do: counted, the
		// estimate is sixteen times the truth, and the segment would be
		// rebuilt over and over (see chainSeg).
		c.salt++
	}
	c.reserve(n)
	for off, h := range c.keys[1] {
		if f, spare := c.hashBits(h); f != fp || spare != uint64(off) {
			t.Fatalf("hash %d: fingerprint %#x, spare bits %d", off, f, spare)
		}
		if !c.claim(h, loc(1, off)) {
			t.Fatalf("claim %d refused", off)
		}
	}
	if reads != 0 {
		t.Fatalf("%d claims of one fingerprint read %d blocks' hashes, want none", n, reads)
	}
	for off, h := range c.keys[1] {
		if got, ok := c.find(h); !ok || got != loc(1, off) {
			t.Fatalf("find %d: %#x %v", off, got, ok)
		}
	}
	if reads != n {
		t.Fatalf("%d finds read %d blocks' hashes, want one each", n, reads)
	}
}

// A table reserved for n entries takes n without splitting or growing a
// segment (its directory is the one reserved, segment for segment), finds
// every one, still computes the homes of the segments reserve made once
// one is reshaped, keeps them while a quarter of the entries are left,
// and merges back to one segment when they leave; a reservation past the
// cap is capped.
func TestChainTableReserve(t *testing.T) {
	const runs, perRun = 100, maxRunLen
	const n = runs * perRun
	// Random hashes, as engines' are: hashes in arithmetic progression
	// leave the quarter kept (off%4 == 0) in a lattice that a table's
	// random multiplier can map away from some segments (one table in
	// about 1,500 had 32 segments left empty, and rightly merged).
	rng := rand.New(rand.NewPCG(5, 6))
	c := newTestChain(runs, perRun, func(int, int) uint64 { return rng.Uint64() })
	c.reserve(n)
	reserved := c.dir.Load()
	segs := reserved.loaded()
	if reserved.depth != 8 || len(reserved.segs) != 256 {
		t.Fatalf("reserved depth %d, %d segments; want 8, 256 (%d entries at load %v)", reserved.depth, len(reserved.segs), n, reserveLoad)
	}
	for id := 1; id <= runs; id++ {
		for off := range perRun {
			if !c.claim(c.keys[id][off], loc(id, off)) {
				t.Fatalf("claim %d/%d refused", id, off)
			}
		}
	}
	if d := c.dir.Load(); d != reserved || !slices.Equal(d.loaded(), segs) {
		t.Fatalf("the directory changed filling what it was reserved for: depth %d, %d segments", d.depth, len(d.segs))
	}
	checkHomeSlots(t, c, true)
	// Reshaping one segment (here a rebuild: it is not half full) leaves
	// the others' homes computed.
	if old := reserved.segs[37].Load(); !c.grow(old) || c.dir.Load().segs[37].Load() == old {
		t.Fatal("a reserved segment was not reshaped")
	}
	if d := c.dir.Load(); d.reserved.live != len(reserved.segs)-1 {
		t.Fatalf("after a reshape: %d reserved segments left of %d", d.reserved.live, len(reserved.segs))
	}
	checkHomeSlots(t, c, true)
	// Releasing three quarters of the entries (400 left a segment, 25
	// counted) keeps the reservation; releasing the rest gives it up.
	for _, left := range []bool{true, false} {
		for id := 1; id <= runs; id++ {
			for off := range perRun {
				if left == (off%4 == 0) {
					continue
				}
				if got, ok := c.find(c.keys[id][off]); !ok || got != loc(id, off) {
					t.Fatalf("find %d/%d: %#x %v", id, off, got, ok)
				}
				c.release(c.keys[id][off], loc(id, off))
			}
		}
		if d := c.dir.Load(); left && (d.slab == nil || d.reserved.live != len(reserved.segs)-1) {
			t.Fatalf("3/4 of the entries released: %d reserved segments left of %d", d.reserved.live, len(reserved.segs)-1)
		}
	}
	if segs := c.dir.Load().loaded(); slices.ContainsFunc(segs, func(s *chainSeg) bool { return s != segs[0] }) {
		t.Fatal("segments left unmerged after every release")
	}
	// Sized for no blocks, a tree is a grown one: nothing reserved.
	for _, n := range []int{0, -5} {
		if d := NewCompressedTreeSized(n).chain.dir.Load(); d.slab != nil || len(d.segs) != 1 || d.segs[0].Load().spare {
			t.Fatalf("NewCompressedTreeSized(%d) reserved its table", n)
		}
	}
	for n, want := range map[int]uint8{0: 0, 2867: 0, 2868: 1, 5_660_000: 11, 1 << 40: maxReserveDepth} {
		if got := reserveDepth(n); got != want {
			t.Errorf("reserveDepth(%d) = %d, want %d", n, got, want)
		}
	}
}

// Writers claim, find and release at once: blocks of their own, and
// hashes every writer claims for a block of its own, of which exactly one
// wins; nothing is lost through the splits their inserts cause. Each asks
// for its claim's home slot first, as a store does; over a table reserved
// for part of the entries, too, whose reserved segments split and merge
// under them.
func TestChainTableConcurrent(t *testing.T) {
	for _, reserve := range []int{0, 4_000} {
		t.Run(fmt.Sprintf("reserve=%d", reserve), func(t *testing.T) { testChainTableConcurrent(t, reserve) })
	}
}

func testChainTableConcurrent(t *testing.T, reserve int) {
	const writers, perRun, shared = 4, maxRunLen, 2_000
	c := newTestChain(writers, perRun, func(id, off int) uint64 {
		if off < shared {
			return uint64(off) * 0x2545F4914F6CDD1D // every writer's block off has it
		}
		return uint64(id)<<32 | uint64(off)
	})
	if reserve > 0 {
		c.reserve(reserve)
	}
	won := make([][]bool, writers+1)
	var wg sync.WaitGroup
	for id := 1; id <= writers; id++ {
		won[id] = make([]bool, perRun)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(id), 0))
			for off := range perRun {
				h := c.keys[id][off]
				c.prepare(h)
				won[id][off] = c.claim(h, loc(id, off))
				if off >= shared && !won[id][off] {
					t.Errorf("writer %d lost its own hash %#x", id, h)
					return
				}
				if back := rng.IntN(off + 1); back >= shared && won[id][back] {
					// An own block claimed earlier: found, and some released.
					if got, ok := c.find(c.keys[id][back]); !ok || got != loc(id, back) {
						t.Errorf("writer %d: find of its block %d = %#x %v", id, back, got, ok)
						return
					}
					if rng.IntN(4) == 0 {
						c.release(c.keys[id][back], loc(id, back))
						won[id][back] = false
					}
				}
			}
			// Empty the table of its own blocks (segments merge while the
			// others insert), then take a third back (they split again).
			for round := range 2 {
				for off := shared; off < perRun; off++ {
					switch {
					case round == 0 && won[id][off]:
						c.release(c.keys[id][off], loc(id, off))
						won[id][off] = false
					case round == 1 && off%3 == 0:
						won[id][off] = c.claim(c.keys[id][off], loc(id, off))
					}
				}
			}
		})
	}
	wg.Wait()
	if d := c.dir.Load(); reserve > 0 && d.slab != nil && d.reserved.live == 1<<d.slabDepth {
		t.Fatal("no reserved segment was reshaped under the writers")
	}
	checkHomeSlots(t, c, c.dir.Load().slab != nil)
	for off := range shared {
		winners := 0
		for id := 1; id <= writers; id++ {
			if won[id][off] {
				winners++
				if got, ok := c.find(c.keys[id][off]); !ok || got != loc(id, off) {
					t.Fatalf("shared hash %d won by %d, found at %#x %v", off, id, got, ok)
				}
			}
		}
		if winners != 1 {
			t.Fatalf("shared hash %d claimed by %d writers", off, winners)
		}
	}
	for id := 1; id <= writers; id++ {
		for off := shared; off < perRun; off++ {
			if got, ok := c.find(c.keys[id][off]); ok != won[id][off] || ok && got != loc(id, off) {
				t.Fatalf("writer %d block %d: find %#x %v, claimed %v", id, off, got, ok, won[id][off])
			}
		}
	}
}

// A block stored and evicted again and again leaves a tombstone at each
// release, and its next claim, which takes the first empty slot, lands
// past them all: a claim whose probe passes maxTombs tombstones purges its
// segment of them, so no probe passes many more, grown or reserved, with
// one writer or several at once; and every claim and release stays exact.
func TestChainTablePurge(t *testing.T) {
	const writers, hashes, rounds = 4, 16, 1_500
	for _, reserve := range []int{0, 1_000} {
		for _, concurrent := range []bool{false, true} {
			t.Run(fmt.Sprintf("reserve=%d/concurrent=%v", reserve, concurrent), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(11, uint64(reserve)))
				c := newTestChain(writers, hashes, func(int, int) uint64 { return rng.Uint64() })
				if reserve > 0 {
					c.reserve(reserve)
				}
				worst := make([]int, writers+1)
				churn := func(id int) {
					for r := range rounds {
						for off, h := range c.keys[id] {
							if !c.claim(h, loc(id, off)) {
								t.Errorf("writer %d, round %d: claim of its hash %d refused", id, r, off)
								return
							}
						}
						for off, h := range c.keys[id] {
							fp, spare := c.hashBits(h)
							s := c.segment(fp)
							got, _, passed, ok := c.probe(s, h, fp, spare)
							tombs := countTombs(s, s.home(fp, spare), passed)
							if !ok || got != loc(id, off) {
								t.Errorf("writer %d, round %d: hash %d found at %#x %v", id, r, off, got, ok)
								return
							}
							worst[id] = max(worst[id], tombs)
							c.release(h, loc(id, off))
						}
					}
				}
				if concurrent {
					var wg sync.WaitGroup
					for id := 1; id <= writers; id++ {
						wg.Go(func() { churn(id) })
					}
					wg.Wait()
				} else {
					churn(1)
				}
				// Each round adds at most writers*hashes tombstones past a
				// probe that found fewer than maxTombs; without purges,
				// probes pass thousands.
				for id, w := range worst {
					if w > maxTombs+writers*hashes {
						t.Fatalf("writer %d: a probe passed %d tombstones, want at most %d", id, w, maxTombs+writers*hashes)
					}
				}
				for id := 1; id <= writers; id++ {
					for _, h := range c.keys[id] {
						if got, ok := c.find(h); ok {
							t.Fatalf("released hash %#x found at %#x", h, got)
						}
					}
				}
			})
		}
	}
}

// countTombs counts the tombstones among the first n slots of s's probe
// from home.
func countTombs(s *chainSeg, home, n int) int {
	t := 0
	for i, k := home, 0; k < n; i, k = s.next(i, home), k+1 {
		if isTomb(atomic.LoadUint64(&s.slots[i])) {
			t++
		}
	}
	return t
}

// A location that does not fit a slot is never claimed.
func TestChainTableEncodes(t *testing.T) {
	c := newTestChain(1, 1, func(int, int) uint64 { return 42 })
	if c.claim(42, uint64(1)<<slotIDBits<<32) || c.claim(42, loc(1, maxRunLen)) {
		t.Fatal("claimed a location past the slot's bits")
	}
	for _, l := range []uint64{loc(1, 0), loc(1<<slotIDBits-1, maxRunLen-1)} {
		v, ok := c.encode(c.fingerprint(42), l)
		if !ok || decode(v) != l || slotFP(v) != c.fingerprint(42) {
			t.Fatalf("encode %#x: %#x %v", l, v, ok)
		}
	}
}

// A segment's sampled count estimates its entries within a few percent,
// whichever hashes it holds: here every fingerprint has its low bits zero,
// which a sample picked by those bits would count all of (an estimate
// sixteen times the truth, and a rebuild on every insert).
func TestChainTableCountSample(t *testing.T) {
	const runs, perRun = 10, 2000
	const n = runs * perRun
	rng := rand.New(rand.NewPCG(3, 4))
	known := chainTable{mult: fibMult}
	c := newTestChain(runs, perRun, func(int, int) uint64 {
		for {
			if h := rng.Uint64(); known.fingerprint(h)&(countWeight-1) == 0 {
				return h
			}
		}
	})
	c.mult = fibMult // the fingerprints chosen
	for id := 1; id <= runs; id++ {
		for off := range perRun {
			if !c.claim(c.keys[id][off], loc(id, off)) {
				t.Fatalf("claim %d/%d refused", id, off)
			}
		}
	}
	estimate, live := 0, 0
	segs := c.dir.Load().loaded()
	for i, s := range segs {
		if i == 0 || s != segs[i-1] {
			estimate += entries(s.count.Load())
			live += countLive(s)
		}
	}
	if live != n || estimate < n*85/100 || estimate > n*115/100 {
		t.Fatalf("%d entries counted as %d (want %d within 15%%)", live, estimate, n)
	}
}

// A segment's header fills two cache lines, the count alone on the second.
func TestChainSegLayout(t *testing.T) {
	if n := unsafe.Sizeof(chainSeg{}); n != 128 {
		t.Fatalf("chainSeg is %d bytes", n)
	}
	if off := unsafe.Offsetof(chainSeg{}.count); off != 64 {
		t.Fatalf("chainSeg's count is at byte %d", off)
	}
}

// A block's own hash, as the table's lookups read it (keyOf), is there
// only below its run's published length: a trimmed block keeps its hash
// in the array (readers may still be in it), but has none, and a run
// regrown over the trim names its new blocks.
func TestOwnHashBelowLength(t *testing.T) {
	tr := NewCompressedTree()
	ev := func(d kvevent.Data) kvevent.RouterEvent {
		return kvevent.RouterEvent{WorkerID: 1, Event: kvevent.Event{Data: d}}
	}
	blocks := []kvevent.StoredBlock{{BlockHash: 101, TokensHash: 1}, {BlockHash: 102, TokensHash: 2}, {BlockHash: 103, TokensHash: 3}}
	if err := tr.Apply(ev(kvevent.Stored{Blocks: blocks})); err != nil {
		t.Fatal(err)
	}
	loc, ok := tr.chain.find(103)
	if !ok {
		t.Fatal("block 103 not in the table")
	}
	if h, ok := tr.ownHash(loc); !ok || h != 103 {
		t.Fatalf("ownHash of the stored block = %d, %v; want 103", h, ok)
	}
	if err := tr.Apply(ev(kvevent.Removed{BlockHashes: []uint64{103}})); err != nil {
		t.Fatal(err)
	}
	if h, ok := tr.ownHash(loc); ok {
		t.Fatalf("ownHash of the trimmed block = %d; want none", h)
	}
	if err := tr.Apply(ev(kvevent.Stored{HasParent: true, ParentHash: 102, Blocks: []kvevent.StoredBlock{{BlockHash: 104, TokensHash: 4}}})); err != nil {
		t.Fatal(err)
	}
	if h, ok := tr.ownHash(loc); !ok || h != 104 {
		t.Fatalf("ownHash of the block regrown there = %d, %v; want 104", h, ok)
	}
}

// A probe from any home visits every slot of its segment once: its home's
// cache line first, from home on, then each next line in turn.
func TestChainSegProbeOrder(t *testing.T) {
	for _, n := range []int{segSmall, segSlots} {
		s := newSeg(0, n)
		for _, home := range []int{0, 5, 7, 8, 1234, n - 8, n - 3, n - 1} {
			seen := make([]bool, n)
			i := home
			for k := range n {
				if seen[i] {
					t.Fatalf("%d slots, home %d: slot %d visited twice (step %d)", n, home, i, k)
				}
				seen[i] = true
				if line := (home/lineSlots + k/lineSlots) % (n / lineSlots); i/lineSlots != line {
					t.Fatalf("%d slots, home %d: step %d is slot %d, not in line %d", n, home, k, i, line)
				}
				i = s.next(i, home)
			}
			if i != home {
				t.Fatalf("%d slots, home %d: the probe does not come back to its home (%d)", n, home, i)
			}
		}
	}
}

// BenchmarkChainTableClaims claims 5.7M random hashes (the field's corpus
// claims as many) into a table reserved as the corpus's is (4.19M entries
// at reserveLoad: 2,048 segments, 64 MiB), or into one grown from a
// single segment (table=grown: its splits, copies and new segments'
// pages included), each home slot asked for ahead hashes before its
// claim, as walker.claim does, or not at all (ahead=0), by one writer or
// two (disjoint hashes). It is the table's share of a store with nothing
// else around it: what a claim costs where every one is a cache miss, and
// what a second core adds to that.
func BenchmarkChainTableClaims(b *testing.B) {
	const runs, perRun = 1390, maxRunLen
	rng := rand.New(rand.NewPCG(1, 2))
	c := newTestChain(runs, perRun, func(int, int) uint64 { return rng.Uint64() })
	claims := func(ahead, writers, g int) {
		for id := 1 + g; id <= runs; id += writers {
			ks := c.keys[id]
			for p := range ks {
				if q := p + ahead; ahead > 0 && q < len(ks) {
					c.prepare(ks[q])
				}
				if !c.claim(ks[p], loc(id, p)) {
					panic(fmt.Sprintf("claim %d/%d refused", id, p))
				}
			}
		}
	}
	for _, bc := range []struct {
		table          string
		ahead, writers int
	}{{"reserved", 0, 1}, {"reserved", 8, 1}, {"reserved", 32, 1}, {"reserved", 8, 2}, {"grown", 8, 1}, {"grown", 8, 2}} {
		b.Run(fmt.Sprintf("table=%s/ahead=%d/writers=%d", bc.table, bc.ahead, bc.writers), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				c.init(c.keyOf)
				if bc.table == "reserved" {
					c.reserve(256 * 16384)
				}
				runtime.GC()
				b.StartTimer()
				var wg sync.WaitGroup
				for g := range bc.writers {
					wg.Go(func() { claims(bc.ahead, bc.writers, g) })
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(runs*perRun), "ns/claim")
		})
	}
}

// fibHash returns the hash whose product by fibMult is fp's bits over
// low's (low < 2^(64-fpBits)): its fingerprint is fp in a table
// multiplying by fibMult, and its spare bits low's top segBits.
func fibHash(fp, low uint64) uint64 {
	inv := uint64(fibMult) // fibMult's inverse mod 2^64, by Newton's method
	for range 6 {
		inv *= 2 - fibMult*inv
	}
	return inv * (fp<<(64-fpBits) | low)
}

// claimAll claims every key of c, within a minute: the locations it
// refused.
func claimAll(t *testing.T, c *testChain) (refused map[uint64]bool) {
	t.Helper()
	done := make(chan map[uint64]bool)
	go func() {
		refused := map[uint64]bool{}
		for id := 1; id < len(c.keys); id++ {
			for off, h := range c.keys[id] {
				if !c.claim(h, loc(id, off)) {
					refused[loc(id, off)] = true
				}
			}
		}
		done <- refused
	}()
	select {
	case refused = <-done:
		return refused
	case <-time.After(time.Minute):
		t.Fatal("claims still running after a minute")
		return nil
	}
}

// checkFinds checks that find answers every claimed key and no refused
// one.
func checkFinds(t *testing.T, c *testChain, refused map[uint64]bool) {
	t.Helper()
	for id := 1; id < len(c.keys); id++ {
		for off, h := range c.keys[id] {
			got, ok := c.find(h)
			if want := !refused[loc(id, off)]; ok != want || ok && got != loc(id, off) {
				t.Fatalf("find %d/%d: %#x %v, want found %v", id, off, got, ok, want)
			}
		}
	}
}

// Hashes chosen to share one fingerprint, in a table whose multiplier is
// known (an engine that knew it): they fill one segment and no split can part
// them. Claims past it are refused (their blocks are named by their
// workers) rather than loop forever putting them into one half, as a
// split did; every claim taken is found, and once they are released the
// table takes other hashes again.
func TestChainTableCraftedFingerprint(t *testing.T) {
	const runs, perRun, fp = 10, 1000, 0xABCDEF1
	c := newTestChain(runs, perRun, func(id, off int) uint64 { return fibHash(fp, uint64(id*perRun+off)<<20|0x5A5A5) })
	c.mult = fibMult
	for c.counted(fp) {
		// Counted, the estimate would be sixteen times the truth, and the
		// segment rebuilt on every insert: the random multiplier's other
		// task.
		c.salt++
	}
	refused := claimAll(t, c)
	if d := c.dir.Load(); len(refused) == 0 || len(refused) > runs*perRun-segMaxUsed || d.depth > 0 {
		t.Fatalf("%d of %d claims refused, directory depth %d", len(refused), runs*perRun, d.depth)
	}
	checkFinds(t, c, refused)
	for id := 1; id <= runs; id++ {
		for off, h := range c.keys[id] {
			c.release(h, loc(id, off))
		}
	}
	if n := chainLive(c); n != 0 {
		t.Fatalf("%d entries left after every release", n)
	}
	for id := 1; id <= runs; id++ {
		for off := range c.keys[id] {
			c.keys[id][off] = uint64(id*perRun + off)
		}
	}
	if refused := claimAll(t, c); len(refused) != 0 {
		t.Fatalf("%d claims of other hashes refused after the crafted ones left", len(refused))
	}
	checkFinds(t, c, nil)
}

// Hashes chosen so that every split of the segment holding them parts a
// thousand from the rest, which share a longer prefix of fingerprint: each
// split deepened the directory, and doubled it (to 2^30 slots, 8 GiB, with
// a thousand entries more a level). The directory stops at its bound, a
// segment a slot or 2^16 slots: claims past it are refused, and every
// claim taken is found.
func TestChainTableCraftedPrefixes(t *testing.T) {
	const levels, perRun = 16, 4000
	c := newTestChain(levels+2, perRun, func(id, off int) uint64 {
		fp := uint64(off) * 2654435761 % segSlots // top 16 bits zero: runs 1 and levels+2
		if level := id - 2; level >= 0 && level < levels {
			fp |= 1 << (fpBits - 1 - level) // run id: the prefix's bit id-2 set
		}
		return fibHash(fp, uint64(id)<<24|uint64(off))
	})
	c.mult = fibMult
	c.keys[1] = c.keys[1][:2000]
	for id := 2; id < levels+2; id++ {
		c.keys[id] = c.keys[id][:1000]
	}
	refused := claimAll(t, c)
	if d := c.dir.Load(); len(d.segs) > maxFreeDir || len(refused) == 0 {
		t.Fatalf("directory of %d slots (at most %d wanted), %d claims refused", len(d.segs), maxFreeDir, len(refused))
	}
	checkFinds(t, c, refused)
}

// A random multiplier parts hashes chosen to share a fingerprint under
// the Fibonacci one as it parts random ones: over 50 tables, 4,096 such
// hashes share fewer than ten fingerprints in all, where random hashes
// would share about 0.4 (a random XOR before the Fibonacci multiplier
// left ~60 shared in each table).
func TestChainTableMultiplier(t *testing.T) {
	const n, fp, tables = 4096, 0xABCDEF1, 50
	known := chainTable{mult: fibMult}
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = fibHash(fp, uint64(i)<<20|0x5A5A5)
		if known.fingerprint(hs[i]) != fp {
			t.Fatalf("hash %d: fingerprint %#x under fibMult", i, known.fingerprint(hs[i]))
		}
	}
	shared := 0
	for range tables {
		var c chainTable
		c.init(nil)
		seen := map[uint64]int{}
		for _, h := range hs {
			shared += seen[c.fingerprint(h)]
			seen[c.fingerprint(h)]++
		}
	}
	if shared >= 10 {
		t.Fatalf("%d chosen hashes share %d fingerprints in %d tables of random multipliers", n, shared, tables)
	}
}

// chainLive counts the table's entries.
func chainLive(c *testChain) int {
	n, seen := 0, map[*chainSeg]bool{}
	for _, s := range c.dir.Load().loaded() {
		if !seen[s] {
			seen[s] = true
			n += countLive(s)
		}
	}
	return n
}

// distinct returns segs without repeats (a segment serves adjacent
// directory slots).
func distinct(segs []*chainSeg) []*chainSeg {
	var out []*chainSeg
	for _, s := range segs {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// Claims of one hash at once, by blocks of different runs (the tree's
// aliases), beside writers storing and evicting other hashes of the same
// home: its entry is any one claim's at a time, never two, and every
// release leaves the table as it was. The races each step of a claim
// guards are too narrow to meet by chance here; the tests after this one
// hold claims to meet them. The churn also checks that claims do take
// tombstones: without, every release left one and probes passed up to
// maxTombs of them between purges.
func TestChainTableAliasChurn(t *testing.T) {
	for _, splits := range []bool{false, true} {
		t.Run(fmt.Sprintf("splits=%v", splits), func(t *testing.T) { testChainTableAliasChurn(t, splits) })
	}
}

// testChainTableAliasChurn is TestChainTableAliasChurn; with splits, a
// filler claims hashes of other homes meanwhile, so that the segments
// split under the claims (a claim seeing its segment frozen claims again
// in the next: see again).
func testChainTableAliasChurn(t *testing.T, splits bool) {
	const aliasers, shared, churners, own, fillRuns, fill = 4, 2, 3, 8, 10, 2_000
	rounds := 3_000
	if testing.Short() || raceEnabled {
		rounds = 600
	}
	rng := rand.New(rand.NewPCG(5, 6))
	filler := aliasers + churners + 1 // the first of fillRuns runs
	c := newTestChain(filler+fillRuns-1, fill, func(id, off int) uint64 {
		switch {
		case id <= aliasers:
			return homeHash(1 + off) // the same hashes for every aliaser
		case id < filler:
			return homeHash(100 + id*own + off)
		}
		return rng.Uint64()
	})
	c.mult = fibMult
	owner := make([]atomic.Int64, shared)
	worst := make([]int, aliasers+churners+1)
	var wg sync.WaitGroup
	if splits {
		wg.Go(func() {
			for id := filler; id < len(c.keys); id++ {
				for off, h := range c.keys[id] {
					if !c.claim(h, loc(id, off)) {
						t.Errorf("filler: claim %d/%d refused", id, off)
						return
					}
				}
			}
		})
	}
	for id := 1; id <= aliasers+churners; id++ {
		wg.Go(func() {
			for r := range rounds {
				if id > aliasers { // a churner: claim its hashes, find, release
					for off := range own {
						if !c.claim(c.keys[id][off], loc(id, off)) {
							t.Errorf("churner %d, round %d: claim of its own hash %d refused", id, r, off)
							return
						}
					}
					for off := range own {
						h := c.keys[id][off]
						fp, spare := c.hashBits(h)
						s := c.segment(fp)
						got, _, passed, ok := c.probe(s, h, fp, spare)
						if !ok || got != loc(id, off) {
							t.Errorf("churner %d, round %d: hash %d found at %#x %v", id, r, off, got, ok)
							return
						}
						worst[id] = max(worst[id], countTombs(s, s.home(fp, spare), passed))
						c.release(h, loc(id, off))
					}
					continue
				}
				off := r % shared
				h := c.keys[id][off]
				if !c.claim(h, loc(id, off)) {
					continue
				}
				if o := owner[off].Swap(int64(id)); o != 0 {
					t.Errorf("round %d: shared hash %d claimed by aliasers %d and %d at once", r, off, o, id)
					return
				}
				if got, ok := c.find(h); !ok || got != loc(id, off) {
					t.Errorf("aliaser %d, round %d: its shared hash %d found at %#x %v", id, r, off, got, ok)
					return
				}
				owner[off].Store(0)
				c.release(h, loc(id, off))
			}
		})
	}
	wg.Wait()
	for id := filler; splits && id < len(c.keys); id++ {
		for off, h := range c.keys[id] {
			c.release(h, loc(id, off))
		}
	}
	if n := chainLive(c); n != 0 {
		t.Fatalf("%d entries left after every release", n)
	}
	if d := c.dir.Load(); (d.depth > 0) != splits {
		t.Fatalf("directory depth %d, splits %v", d.depth, splits)
	}
	// Live entries of the home are at most shared+churners*own = 26; a
	// claim takes a tombstone once its probe passes reuseProbe slots,
	// reuseTombs of them tombstones, so probes stay near that.
	for id, w := range worst {
		if w > maxTombs/2 {
			t.Fatalf("churner %d: a probe passed %d tombstones", id, w)
		}
	}
}

// clusterChain is a table whose hashes all have one home: run 1 holds
// others' blocks, whose entries fill the home's probe, and runs 2 to 4
// one block each, of one hash h, claimed at once in the tests below.
func clusterChain(others int) (c *testChain, h uint64) {
	c = newTestChain(4, others, func(id, off int) uint64 {
		if id == 1 {
			return homeHash(100 + off)
		}
		return homeHash(1)
	})
	c.mult = fibMult
	for off := range others {
		if !c.claim(c.keys[1][off], loc(1, off)) {
			panic("claim refused")
		}
	}
	return c, homeHash(1)
}

// homeHash returns the k-th of hashes whose fingerprints, in a table
// multiplying by fibMult, share their low 12 bits: every one has one home
// in its segment, however the table splits; the bits above tell them
// apart.
func homeHash(k int) uint64 {
	return fibHash(uint64(k)<<segBits|0x123, 0xBEEF)
}

// releaseOthers releases the first n of the others' blocks: tombstones
// at the start of h's probe.
func releaseOthers(c *testChain, n int) {
	for off := range n {
		c.release(c.keys[1][off], loc(1, off))
	}
}

// holdClaim makes the claim for at the point given wait there, once, until
// released: reached says it got there.
func holdClaim(c *testChain, at uint64, point claimPoint) (reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	c.hook = func(l uint64, p claimPoint) {
		if l == at && p == point && once.CompareAndSwap(false, true) {
			close(reached)
			<-release
		}
	}
	return reached, release
}

func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("%s: still waiting after a minute", what)
		var zero T
		return zero
	}
}

// checkOnlyClaim checks that h's entry is want's, and that releasing it
// and the others' leaves the table empty.
func checkOnlyClaim(t *testing.T, c *testChain, h, want uint64) {
	t.Helper()
	if got, ok := c.find(h); !ok || got != want {
		t.Fatalf("h found at %#x %v, want %#x", got, ok, want)
	}
	c.release(h, want)
	releaseOthers(c, len(c.keys[1]))
	if n := chainLive(c); n != 0 {
		t.Fatalf("%d entries left after every release: a claim that lost left its entry", n)
	}
}

// A claim settled in its home line (lineFree), held after its probe while
// its segment is reshaped: its swap lands in the frozen segment, after the
// reshape's copy, so it must see the freeze and claim again in the
// replacement. It wins, and its entry is found there. In a grown segment
// and in a reserved one (homes from the hashes' spare bits).
func TestChainTableClaimInFrozenLine(t *testing.T) {
	for _, table := range []string{"grown", "reserved"} {
		t.Run(table, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			c := newTestChain(1, 64, func(int, int) uint64 { return rng.Uint64() })
			if table == "reserved" && !c.reserve(1) {
				t.Fatal("the table took no reservation")
			}
			off := slices.IndexFunc(c.keys[1], func(h uint64) bool { return !c.counted(c.fingerprint(h)) })
			if off < 0 {
				t.Fatal("every key's entry is counted")
			}
			h, at := c.keys[1][off], loc(1, off) // not counted: its claim skips tookEmpty
			fp, _ := c.hashBits(h)
			s := c.segment(fp)
			if s.spare != (table == "reserved") {
				t.Fatalf("the claim's segment takes spare homes: %v", s.spare)
			}
			reached, release := holdClaim(c, at, claimProbed)
			won := make(chan bool)
			go func() { won <- c.claim(h, at) }()
			within(t, reached, "the held claim")
			if !c.grow(s) {
				t.Fatal("the claim's segment was not reshaped")
			}
			close(release)
			if !within(t, won, "the held claim") {
				t.Fatal("the claim lost, with no other entry of h")
			}
			if got, ok := c.find(h); !ok || got != at {
				t.Fatalf("h found at %#x %v, want %#x: the claim's entry was left in the frozen segment", got, ok, at)
			}
		})
	}
}

// A claim of h taking an empty slot at the end of h's probe, whose probe
// ran before releases left tombstones at its start, where another claim
// of h then won: the first claim looks back and loses (rivalled).
func TestChainTableClaimLooksBack(t *testing.T) {
	c, h := clusterChain(reuseProbe + 1)
	b := loc(3, 0)
	reached, release := holdClaim(c, b, claimProbed)
	won := make(chan bool)
	go func() { won <- c.claim(h, b) }()
	within(t, reached, "the held claim")
	releaseOthers(c, reuseTombs) // tombstones at the start of h's probe
	if !c.claim(h, loc(2, 0)) {
		t.Fatal("the claim taking the tombstone lost")
	}
	fp, spare := c.hashBits(h)
	s := c.segment(fp)
	if v := atomic.LoadUint64(&s.slots[s.home(fp, spare)]); decode(v) != loc(2, 0) {
		t.Fatalf("h's home holds %#x: the claim did not take the tombstone there", v)
	}
	close(release)
	if within(t, won, "the held claim") {
		t.Fatal("both claims of h won")
	}
	checkOnlyClaim(t, c, h, loc(2, 0))
}

// A claim of h about to take a tombstone, held while another claim of h
// takes the empty slot past it and wins: the first, looking at the rest
// of the probe once its tombstone is pending, gives way (contended).
func TestChainTableClaimGivesWay(t *testing.T) {
	c, h := clusterChain(reuseProbe + 1)
	b, a := loc(3, 0), loc(2, 0)
	reachedB, releaseB := holdClaim(c, b, claimProbed)
	wonB := make(chan bool)
	go func() { wonB <- c.claim(h, b) }()
	within(t, reachedB, "the empty slot's claim")
	releaseOthers(c, reuseTombs)
	reachedA, releaseA := holdClaim(c, a, claimProbed)
	wonA := make(chan bool)
	go func() { wonA <- c.claim(h, a) }()
	within(t, reachedA, "the tombstone's claim")
	close(releaseB)
	if !within(t, wonB, "the empty slot's claim") {
		t.Fatal("the empty slot's claim lost, with no other entry of h")
	}
	close(releaseA)
	if within(t, wonA, "the tombstone's claim") {
		t.Fatal("both claims of h won")
	}
	checkOnlyClaim(t, c, h, b)
}

// Two claims of h taking tombstones at once: the one pending lower goes
// first and wins; the other gives way until it is an entry, and loses.
func TestChainTableClaimsPendingTogether(t *testing.T) {
	c, h := clusterChain(reuseProbe + 2)
	releaseOthers(c, reuseTombs+1)
	a1, a2 := loc(2, 0), loc(3, 0)
	reached, release := make(chan struct{}), make(chan struct{})
	retried := make(chan struct{})
	var held, probes atomic.Int32
	c.hook = func(l uint64, p claimPoint) {
		switch {
		case l == a1 && p == claimPended && held.Add(1) == 1:
			close(reached)
			<-release
		case l == a2 && p == claimProbed && probes.Add(1) == 3:
			close(retried) // it gave way twice
		}
	}
	won1, won2 := make(chan bool), make(chan bool)
	go func() { won1 <- c.claim(h, a1) }()
	within(t, reached, "the first claim")
	go func() { won2 <- c.claim(h, a2) }()
	select {
	case <-won2:
		t.Fatal("the second claim ended while the first was pending below it")
	case <-retried:
	case <-time.After(time.Minute):
		t.Fatal("the second claim neither ended nor retried in a minute")
	}
	close(release)
	if !within(t, won1, "the first claim") {
		t.Fatal("the claim pending lower lost")
	}
	if within(t, won2, "the second claim") {
		t.Fatal("both claims of h won")
	}
	checkOnlyClaim(t, c, h, a1)
}

// tagChain is a table whose hashes all have one home, reserved or not:
// run 1 holds others' blocks at the start of the home's probe, run 2 one
// block of a hash of h's tag that is not h (the same fingerprint where
// the home is the fingerprint's; another fingerprint, of the same bits
// above the home's, where the home is the spare bits'), and runs 3 and 4
// one block each of h.
func tagChain(t *testing.T, reserved bool, others int) (c *testChain, h, kin uint64) {
	t.Helper()
	const fp, spare = 0xABCD123, 0x456
	hash := func(fp, low uint64) uint64 { return fibHash(fp, spare<<(64-fpBits-segBits)|low) }
	h, kin = hash(fp, 1), hash(fp, 2)
	if reserved {
		kin = hash(fp^0x3F, 2)
	}
	c = newTestChain(4, others, func(id, off int) uint64 {
		switch id {
		case 1:
			return hash(uint64(100+off)<<segBits|fp&(segSlots-1), 3)
		case 2:
			return kin
		}
		return h
	})
	c.mult = fibMult
	if reserved {
		c.reserve(64)
	}
	if s := c.segment(c.fingerprint(h)); s.spare != reserved || s.tomb(c.hashBits(h)) != s.tomb(c.hashBits(kin)) {
		t.Fatalf("segment reserved %v, want %v; the two hashes' tombstones differ", s.spare, reserved)
	}
	for off := range others {
		if !c.claim(c.keys[1][off], loc(1, off)) {
			t.Fatal("claim refused")
		}
	}
	return c, h, kin
}

// A hash released and claimed again takes back its slot, its own
// tombstone, reserved segment or not: stored and evicted again and again,
// its probe stays as long as at first. Claims that took empty slots left
// each one a slot further, up to reuseProbe.
func TestChainTableClaimTakesItsTombstone(t *testing.T) {
	for _, reserved := range []bool{false, true} {
		t.Run(fmt.Sprintf("reserved=%v", reserved), func(t *testing.T) {
			c, h, _ := tagChain(t, reserved, 3)
			fp, spare := c.hashBits(h)
			at := loc(3, 0)
			for i := range 2 * reuseProbe {
				if !c.claim(h, at) {
					t.Fatalf("claim %d refused", i)
				}
				if _, _, passed, ok := c.probe(c.segment(fp), h, fp, spare); !ok || passed != 3 {
					t.Fatalf("claim %d: found %v, %d slots into its probe, want 3", i, ok, passed)
				}
				c.release(h, at)
				at ^= loc(3, 0) ^ loc(4, 0)
			}
		})
	}
}

// A claim of h taking the empty slot past an entry akin to h (see akin),
// whose probe ran before that entry was released, where another claim of
// h then took its tombstone, of h's tag, and won: the first claim looks
// back and loses, though its probe was short (rivalled).
func TestChainTableClaimLooksBackAtKin(t *testing.T) {
	for _, reserved := range []bool{false, true} {
		t.Run(fmt.Sprintf("reserved=%v", reserved), func(t *testing.T) {
			c, h, kin := tagChain(t, reserved, 3)
			if !c.claim(kin, loc(2, 0)) {
				t.Fatal("claim refused")
			}
			b := loc(4, 0)
			reached, release := holdClaim(c, b, claimProbed)
			won := make(chan bool)
			go func() { won <- c.claim(h, b) }()
			within(t, reached, "the held claim")
			c.release(kin, loc(2, 0)) // a tombstone of h's tag
			if !c.claim(h, loc(3, 0)) {
				t.Fatal("the claim taking the tombstone lost")
			}
			close(release)
			if within(t, won, "the held claim") {
				t.Fatal("both claims of h won")
			}
			checkOnlyClaim(t, c, h, loc(3, 0))
		})
	}
}
