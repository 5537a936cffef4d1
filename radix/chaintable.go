package radix

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kvradix/kvradix/internal/pages"
	"github.com/kvradix/kvradix/internal/prefetch"
)

// chainTable maps engine block hashes to the blocks they are the own hash
// of, for every worker at once: an engine's block hash is a chain hash of
// the block's tokens and its parent's hash, equal across engines for equal
// content, so one entry serves every worker holding the block. A
// CompressedTree claims a block's entry when it creates the block (see
// crun.eng) and releases it when the block is trimmed; names that disagree
// with it are the workers' own (xworker.xnames).
//
// # Layout
//
// Extendible hashing over segments of 3,584 or 4,096 8-byte slots with
// linear probing by cache line (see chainSeg.next): a directory indexed by
// the top bits of the hash's fingerprint points at segments, and a full
// segment splits in two (or, mostly tombstones, is rebuilt) without
// touching the others, and one whose tombstones lengthen a claim's probe
// is rebuilt without them (see maxTombs). So the table never rehashes as a
// whole, never faults in more than one segment's pages at a time, and a
// slot costs 8 bytes: the hash itself is not kept. A slot packs a 30-bit
// fingerprint of the hash with the block's location (22 bits of run id, 12
// of offset); a probe compares fingerprints, and only on a match reads the
// block's engine hash through keyOf. Splits rehash by fingerprint alone:
// the directory takes the fingerprint's top bits and the home slot its 12
// low bits. Two entries of one home in one segment share all but the
// fingerprint's middle bits: 7 of them at 2,048 segments (6M blocks), so a
// claim reads another block's hash about once in 380 (the trace's store;
// TestChainTableGrownReads); past 262,144 segments none are left, and
// probes read more but stay exact. Two of those bits were the run id's:
// at 28 bits of fingerprint (24 of run id) a claim read another block's
// hash once in 94, a chain of cache misses each, and the grown fresh store
// ran ~4% slower (results/README.md). 2^22 live runs are plenty (the
// trace takes 12,000), and a block past them is named by its workers:
// exactly, more slowly. The offset keeps its 12 bits: runs of 2,048
// blocks at most made the trace's runs 4.6% more, each one more step for
// a lookup. A segment reserved up front takes its homes from 12 bits of
// the hash that the slots do not keep instead, so that its entries of one
// home share only the directory's bits (see chainSeg.home).
//
// # Hashes chosen against it
//
// Engine hashes come from the network. A fingerprint is a multiplication
// by the table's random multiplier (see hashBits), so that hashes cannot
// be chosen to share one; and were they, a segment no split can part is
// left crowded, its claims past it refused (their blocks named by their
// workers, exactly), and the directory doubles only within a bound (see
// splits). Without
// these, hashes of one fingerprint hung a split, and hashes sharing ever
// longer prefixes doubled the directory to 2 GiB.
//
// # Concurrency
//
// Writers of any worker insert and delete at once, without locks: a slot
// goes from empty to an entry by compare-and-swap, an entry becomes a
// tombstone by compare-and-swap, a tombstone an entry again through a
// pending claim (see claim), and a probe that reaches an empty slot ends
// (entries never move within a segment). A split freezes its segment
// before reading it: a writer checks, after its swap, that the segment was
// not frozen, and otherwise waits for the segment's replacement in the
// directory and repeats its operation there, so no write is lost (either
// the split's copy saw the swap, or the writer saw the freeze). Reshapes
// take mu, the directory's lock, to publish and to read the directory's
// bounds only.
//
// A lookup (find) reads slots with atomic loads and takes no lock. It may
// meet a frozen segment, and there an entry a split has already left
// behind; its answer is still exact for the entries its caller relies on
// (those of blocks the caller's worker holds, which no other writer
// inserts or deletes meanwhile), and claim, which decides, rechecks.
type chainTable struct {
	dir atomic.Pointer[chainDir]
	mu  sync.Mutex // serialises directory changes
	// keyOf returns the engine hash block loc is claimed by, or false if
	// loc is no block (its run gone). It is called on a fingerprint match.
	keyOf func(loc uint64) (uint64, bool)
	// ids bounds the run ids a slot takes: 2^22, lower in tests.
	ids uint64
	// salt picks the entries a segment's count counts (see chainSeg).
	salt uint64
	// mult is the odd multiplier of every hash's fingerprint, random (see
	// hashBits).
	mult uint64
	// nsegs is the segments in the directory (under mu): it bounds the
	// directory's doubling (see splits).
	nsegs int
	// doubled, if set, is called (under mu) when the directory doubles,
	// with the segments it serves then.
	doubled func(segs int)
	// keysAhead, if set, loads what keyOf will read for each of a batch
	// of locations, their cache misses overlapping: a resize reads every
	// entry's engine hash (see adopt).
	keysAhead func(locs []uint64)
	// hook, if set (by tests only), is called by a claim for location loc
	// at the points where a test holds it to order claims (claimPoint).
	hook func(loc uint64, at claimPoint)
}

// claimPoint is a point of a claim where a test may hold it.
type claimPoint uint8

const (
	claimProbed claimPoint = iota // probed, about to take a slot
	claimPended                   // a tombstone made pending, about to look at the rest
)

// chainDir is a directory: segment i serves the fingerprints whose top
// depth bits are i. Its depth and length never change: a split past its
// depth publishes a doubled directory, and any other reshape (a split
// within it, a rebuild, a merge) stores its segments into the directory's
// slots in place (see publish).
type chainDir struct {
	depth uint8
	segs  []atomic.Pointer[chainSeg]
	// slab is a reserved table's slots while any segment reserve made is
	// still in the directory (nil in any other): the one serving the
	// fingerprints whose top slabDepth bits are k has slab's k-th segSlots
	// slots, while reserved says so. For those a hash's home slot is found
	// by arithmetic, without reading the segment's header first (see
	// homeSlot).
	slab      []uint64
	slabDepth uint8
	reserved  *slabSet
}

// slabSet is the reserved segments still in the directory, by their place
// in the slab: a bit read by every homeSlot, cleared (under the table's
// mu) when a segment is reshaped. A reader that finds a bit stale asks
// for the wrong slot ahead, which costs it a miss and nothing else: no
// probe starts from homeSlot.
type slabSet struct {
	bits []atomic.Uint64
	live int // bits set; under the table's mu
}

func (r *slabSet) has(k uint64) bool { return r.bits[k/64].Load()&(1<<(k%64)) != 0 }

// chainSeg is one segment: 8-byte slots, 0 empty, chainTomb deleted, read
// and swapped atomically once published. A segment whose entries fill it
// splits into two of segSmall slots: the table's load swings between 0.44
// and 7/8 (full-size halves would swing from 0.44 too, but leave the
// trace's 5.7M blocks at 0.67 where small ones leave them at 0.77), and a
// segment copies two entries, in cache, for each it takes. Growing a small
// segment to segSlots before it split, as the table did, kept its load
// from 0.5 for 3.75 copies: a grown table's claims spent 39% of their time
// copying, and its fresh store was 18% slower (results/README.md). A
// segment whose sampled count ran ahead of its used slots (see below) is
// recounted and left as it is (see recounted): so that the count's error
// splits none early, nor deepens the directory (the trace's 5.7M blocks
// would take 4,096 directory slots, not 2,048, and twice the warm: see
// warmAhead). Only a small segment used past 15/16 of its limit by
// tombstones as much as by entries still grows to segSlots (see grow).
// The slots are an allocation of their own, of 28 or 32 KiB (size classes
// of Go's allocator: with the header they would take a span a page
// larger), or a share of a reserved table's (see reserve), and the header
// takes two cache lines: the count, written by writers on any core, on a
// line of its own, apart from the fields every probe reads.
//
// The count is sampled: only an entry whose fingerprint the table's salt
// picks (one in countWeight) counts, for countWeight entries, when it is
// inserted, released or copied into a segment being built. Writers on
// different cores claim into random segments, and a count written by every
// insert made its header line move between their caches on nearly every
// claim: two writers ran 1.41 times one on the field's corpus, 1.55 with
// the count sampled (results/README.md). Counting the same entries on the
// way in and out keeps the estimate unbiased and never negative; the
// decisions it triggers count the segment before they act: an insert
// finding it full recounts its used slots (recounted), and a reshape
// (grow, merge) counts its entries exactly, frozen. The salt is random,
// so that engines cannot choose hashes that all count (with the estimate
// sixteen times the truth, a segment would be recounted some forty times
// as it filled, ever more often towards full).
// Even sampled, a count written on one core took the line from the
// other's probes, which read the slots and the length beside it: the
// count has its own line (two writers 8% faster on the field's corpus,
// results/README.md).
type chainSeg struct {
	slots   []uint64
	depth   uint8        // its local depth: the directory bits its fingerprints share
	spare   bool         // homes from the hashes' spare bits (a reserved segment: see home)
	crowded bool         // full-size, and splitting it would not make room (see grow)
	frozen  atomic.Bool  // being split, merged or rebuilt: writers go to its replacement
	ahead   atomic.Int32 // how far count ran ahead of the used slots, when last recounted (see recounted)
	tombed  atomic.Bool  // a release has left a tombstone in it (see tombstoned)
	_       [64 - 40]byte
	count   atomic.Int64 // slots used (entries and tombstones) | entries<<32, sampled
	_       [64 - 8]byte
}

func newSeg(depth uint8, slots int) *chainSeg {
	s := &chainSeg{slots: make([]uint64, slots), depth: depth}
	pages.Fault(s.slots)
	return s
}

// home returns the first slot in s of a hash of fingerprint fp and spare
// bits spare (see hashBits). A segment reserve made takes the spare bits,
// the hash's 12 below its fingerprint. Any other segment is built by
// rebuilding others, from their slots alone, so it takes the fingerprint's
// low 12 bits, scaled to its length: two entries of one home there share
// all of their fingerprint but its middle bits (7 at 2,048 segments), and
// a probe reads another block's engine hash through keyOf about once in
// 380 claims, a chain of cache misses each (at 5 bits, once in 94, and 7%
// of the CPU of the field's corpus's events, profiled). In a reserved
// segment they share only its directory bits, so a claim nearly never
// reads one (results/README.md).
func (s *chainSeg) home(fp, spare uint64) int {
	if s.spare {
		return int(spare)
	}
	return int((fp & (segSlots - 1)) * uint64(len(s.slots)) >> segBits)
}

// next returns the slot after i in the probe from home. A probe takes
// home's cache line first (lineSlots slots), from home on, wrapping within
// the line, then the next line's slots in the same order, and so on
// around the segment: a linear probe, by line. Most probes end in their
// home's line, the one prepare asked for ahead; slot by slot, one claim in
// nine went on into the next line, a miss nobody had asked for
// (results/README.md). A segment's length is a multiple of lineSlots.
func (s *chainSeg) next(i, home int) int {
	if j := i&^(lineSlots-1) | (i+1)&(lineSlots-1); j&(lineSlots-1) != home&(lineSlots-1) {
		return j
	}
	line := i&^(lineSlots-1) + lineSlots // the line is done
	if line == len(s.slots) {
		line = 0
	}
	return line | home&(lineSlots-1)
}

// maxUsed is the used slots (entries and tombstones) past which an insert
// grows s: linear probes stay within a few lines.
func (s *chainSeg) maxUsed() int { return len(s.slots) * 7 / 8 }

// nearFull is 15/16 of s's maxUsed: a segment whose sampled count says it
// is full but that uses fewer slots is left as it is (see recounted), and
// a small one holding fewer entries is not split (see grow).
func (s *chainSeg) nearFull() int { return s.maxUsed() - s.maxUsed()/16 }

// mergeBelow is the entries, as s's count estimates them, under which s
// merges with its buddy (see merge): an eighth of its slots, or for a
// segment reserve made, one counted entry, so that it merges once its
// count says it is empty. A reserved table is often emptier than
// reserved (the field's corpus fills its to a third), and merging its
// segments there, as the first did a quarter of the way into the corpus,
// gave up their spare bits, and every segment's computed home until the
// slabSet, for nothing: the slab is held while any is left. Once its
// workers leave, it empties and merges.
func (s *chainSeg) mergeBelow() int {
	if s.spare {
		return countWeight
	}
	return len(s.slots) / 8
}

// countSampleBits sets the share of entries a segment's count counts (see
// chainSeg): one in 16, each for 16, an estimate within a few percent of
// a segment's thousands of entries.
const (
	countSampleBits = 4
	countWeight     = 1 << countSampleBits
)

// counted reports whether entries of fingerprint fp count (see chainSeg):
// the top bits of a multiplicative mix of fp with the table's salt.
func (c *chainTable) counted(fp uint64) bool {
	return (fp^c.salt)*fibMult>>(64-countSampleBits) == 0
}

const (
	lineSlots = 8 // a cache line's slots
	segBits   = 12
	segSlots  = 1 << segBits
	segSmall  = segSlots * 7 / 8
	// segMaxUsed is a full-size segment's maxUsed.
	segMaxUsed = segSlots * 7 / 8

	fpBits    = 30
	chainTomb = 1 // run id 0, offset 1: never a block
	// chainPending, under a fingerprint, is a claim of a hash of that
	// fingerprint in progress (run id 0, offset 2: never a block either):
	// see claim.
	chainPending = 2

	slotIDBits  = 22
	slotOffBits = 12
	// maxRunLen caps a run's length so that every offset fits a slot: a
	// store past it continues in a child run.
	maxRunLen = 1 << slotOffBits
)

// hashBits returns h's fingerprint, the top 30 bits of h times the
// table's multiplier, and its spare bits, the product's next 12, which
// reserved segments take their homes from (see chainSeg.home). The
// multiplier is odd and random (multiply-shift hashing): for any two
// hashes, chosen by an engine that does not know it, the chance that they
// share a fingerprint is at most 2 in 2^30. With a fixed multiplier (the
// Fibonacci one, fibMult) an engine could choose hashes of one
// fingerprint; their entries all share one segment and one home, and
// probing them reads every one's block. A fixed multiplier behind a
// random XOR is no better: 4,096 hashes chosen against the fixed one
// still shared fingerprints 2,000 times as often as random ones.
func (c *chainTable) hashBits(h uint64) (fp, spare uint64) {
	m := h * c.mult
	return m >> (64 - fpBits), m >> (64 - fpBits - segBits) & (segSlots - 1)
}

// fibMult is the Fibonacci multiplier, 2^64 over the golden ratio: the
// tests' tables take it to choose hashes' fingerprints.
const fibMult = 0x9E3779B97F4A7C15

// fingerprint returns h's fingerprint (see hashBits).
func (c *chainTable) fingerprint(h uint64) uint64 {
	fp, _ := c.hashBits(h)
	return fp
}

// encode packs a block's location with its hash's fingerprint; false if
// the location does not fit a slot (its run id is past 2^22: such a block
// is not claimed, and its names are the workers' own).
func (c *chainTable) encode(fp, loc uint64) (uint64, bool) {
	id, off := loc>>32, loc&(1<<32-1)
	if id >= c.ids || off >= 1<<slotOffBits {
		return 0, false
	}
	return fp<<(slotIDBits+slotOffBits) | id<<slotOffBits | off, true
}

// decode returns a slot's location.
func decode(v uint64) uint64 {
	return (v>>slotOffBits)&(1<<slotIDBits-1)<<32 | v&(1<<slotOffBits-1)
}

func slotFP(v uint64) uint64 { return v >> (slotIDBits + slotOffBits) }

// isEntry reports whether slot value v is an entry: a run id, where empty
// slots, tombstones and pending claims have none.
func isEntry(v uint64) bool { return v>>slotOffBits&(1<<slotIDBits-1) != 0 }

// isPending reports whether slot value v is a pending claim.
func isPending(v uint64) bool { return v&(1<<(slotIDBits+slotOffBits)-1) == chainPending }

// isTomb reports whether slot value v is a tombstone: a release leaves the
// tag of the hash it deleted above chainTomb (see tomb).
func isTomb(v uint64) bool { return v&(1<<(slotIDBits+slotOffBits)-1) == chainTomb }

// tomb is the tombstone a release of a hash of fingerprint fp and spare
// bits spare leaves in s: chainTomb under the hash's tag, its fingerprint
// with the bits that choose its home in s (see home) in place of the low
// ones, so that hashes of one tag have one home in s. A claim takes a
// tombstone of its own tag first (see claim).
func (s *chainSeg) tomb(fp, spare uint64) uint64 {
	if s.spare {
		fp = fp&^(segSlots-1) | spare
	}
	return fp<<(slotIDBits+slotOffBits) | chainTomb
}

// akin reports whether a slot of fingerprint vfp may hold, or come to
// hold, a hash of fp's tag: their fingerprints share the bits above a
// home's (see tomb and rivalled).
func akin(vfp, fp uint64) bool { return (vfp^fp)>>segBits == 0 }

// init makes the table empty: one segment.
func (c *chainTable) init(keyOf func(loc uint64) (uint64, bool)) {
	c.keyOf, c.ids, c.salt, c.mult, c.nsegs = keyOf, 1<<slotIDBits, rand.Uint64(), rand.Uint64()|1, 1
	d := &chainDir{segs: make([]atomic.Pointer[chainSeg], 1)}
	d.segs[0].Store(newSeg(0, segSmall))
	c.dir.Store(d)
}

// reserveLoad is the share of a full-size segment's slots a reserved
// table fills with the entries it was sized for: below the 7/8 at which a
// segment splits, so that the count it was sized for splits none.
const reserveLoad = 0.7

// maxReserveDepth bounds a reservation: 2^14 segments, 512 MiB of slots.
const maxReserveDepth = 14

// reserve sizes the table for n entries up front: a directory of
// full-size segments, enough that n entries (at reserveLoad) split none,
// so that filling it moves no entry. Their slots are one allocation made
// resident here, and their headers another: so the inserts that fill it
// fault in no page either (random homes touch every page of a segment
// after a few entries, so this adds little to what the table would soon
// hold anyway). The allocations live as long as one reserved segment
// does. The directory keeps the slots too, so that the address of a home
// slot in a segment reserve made is computed (chainDir.slab) until that
// segment is reshaped. Past maxReserveDepth it reserves that much and
// grows as usual.
//
// A table holding entries moves them into the new segments (see adopt).
// It reserves nothing, and reports false, where the table's directory is
// as deep already, or deeper.
func (c *chainTable) reserve(n int) bool {
	depth := reserveDepth(n)
	return c.takes(depth) && c.adopt(reservedDir(depth))
}

// takes reports whether a reserved directory of the given depth would
// resize the table: it is deeper than the table's, or as deep as a grown
// one.
func (c *chainTable) takes(depth uint8) bool {
	old := c.dir.Load()
	return depth > old.depth || depth == old.depth && old.slab == nil
}

// adopt makes d, a reserved directory (reservedDir) not yet published,
// the table's, moving every entry into it, each one's engine hash read
// (keyOf) for its home there; false, changing nothing, where d would not
// resize the table (takes). The caller excludes every other writer of the
// table meanwhile (a CompressedTree takes every writer stripe). A new
// segment's fingerprints are a part of one old segment's, since d is as
// deep as the old directory, so it takes no more entries than it has
// slots; one that takes more than a segment grows at (only hashes chosen
// against the table do) is split or left crowded by its next claim, as
// any segment is.
func (c *chainTable) adopt(d *chainDir) bool {
	old := c.dir.Load()
	if !c.takes(d.depth) {
		return false
	}
	var (
		last  *chainSeg
		batch [moveBatch]uint64
		n     int
	)
	for i := range old.segs {
		if s := old.segs[i].Load(); s != last { // a segment serves adjacent slots
			last = s
			s.each(func(v uint64) {
				if batch[n], n = v, n+1; n == len(batch) {
					c.move(d, batch[:])
					n = 0
				}
			})
		}
	}
	c.move(d, batch[:n])
	c.dir.Store(d)
	c.nsegs = len(d.segs)
	return true
}

// reservedDir returns an empty reserved directory of the given depth (see
// reserve).
func reservedDir(depth uint8) *chainDir {
	slab := make([]uint64, segSlots<<depth)
	pages.Fault(slab)
	heads := make([]chainSeg, 1<<depth)
	segs := make([]atomic.Pointer[chainSeg], 1<<depth)
	for i := range segs {
		heads[i] = chainSeg{slots: slab[i*segSlots : (i+1)*segSlots : (i+1)*segSlots], depth: depth, spare: true}
		segs[i].Store(&heads[i])
	}
	reserved := &slabSet{bits: make([]atomic.Uint64, (len(segs)+63)/64), live: len(segs)}
	for k := range segs {
		reserved.bits[k/64].Or(1 << (k % 64))
	}
	return &chainDir{depth: depth, segs: segs, slab: slab, slabDepth: depth, reserved: reserved}
}

// moveBatch is how many entries a resize moves at once, their engine
// hashes read and their new homes asked for before any is placed: with
// each read one after another, the writers waited 3.5 times as long:
// 0.15 s a million entries, against 0.04 (results/README.md).
const moveBatch = 32

// move puts entries vs (at most moveBatch) into d, a reserved directory
// not yet published, each at its home there: the spare bits of its
// block's engine hash. An entry whose block is gone (no writer leaves
// one) is dropped.
func (c *chainTable) move(d *chainDir, vs []uint64) {
	var (
		locs  [moveBatch]uint64
		homes [moveBatch]int
	)
	for i, v := range vs {
		locs[i] = decode(v)
	}
	if c.keysAhead != nil {
		c.keysAhead(locs[:len(vs)])
	}
	for i := range vs {
		homes[i] = -1
		if h, ok := c.keyOf(locs[i]); ok {
			fp, spare := c.hashBits(h)
			homes[i] = int(fp>>(fpBits-d.depth)<<segBits | spare)
			prefetch.Write(&d.slab[homes[i]])
		}
	}
	for i, v := range vs {
		if k := homes[i]; k >= 0 {
			c.place(d.segs[k>>segBits].Load(), v, k&(segSlots-1))
		}
	}
}

// reserveDepth is the directory depth reserve gives n entries.
func reserveDepth(n int) uint8 {
	depth := uint8(0)
	for depth < maxReserveDepth && float64(n) > float64(segSlots)*reserveLoad*float64(uint64(1)<<depth) {
		depth++
	}
	return depth
}

// segment returns the segment serving fingerprint fp.
func (c *chainTable) segment(fp uint64) *chainSeg {
	d := c.dir.Load()
	return d.segs[fp>>(fpBits-d.depth)].Load()
}

// index returns the first slot of d serving s, or -1.
func (d *chainDir) index(s *chainSeg) int {
	for i := range d.segs {
		if d.segs[i].Load() == s {
			return i
		}
	}
	return -1
}

// find returns the block engine hash h is claimed by.
func (c *chainTable) find(h uint64) (uint64, bool) {
	fp, spare := c.hashBits(h)
	loc, _, _, ok := c.probe(c.segment(fp), h, fp, spare)
	return loc, ok
}

// homeSlot returns h's home slot. In a segment reserve made its address is
// computed (chainDir.slab); elsewhere it takes the segment's header,
// slots and length, a load that must complete before the slot's can
// start. A claim's prefetches ahead waited on those headers (256 KB of
// them in the table reserved for the field's corpus, in caches the
// table's lines stream through), one per slot asked for: computing the
// address made the fresh sized store 7% faster and the field's corpus 3%
// (results/README.md).
func (c *chainTable) homeSlot(h uint64) *uint64 {
	fp, spare := c.hashBits(h)
	d := c.dir.Load()
	if d.slab != nil {
		if k := fp >> (fpBits - d.slabDepth); d.reserved.has(k) {
			return &d.slab[k<<segBits|spare] // a reserved segment's home
		}
	}
	s := d.segs[fp>>(fpBits-d.depth)].Load()
	return &s.slots[s.home(fp, spare)]
}

// peek loads h's home slot, so that its cache miss overlaps others.
func (c *chainTable) peek(h uint64) uint64 { return atomic.LoadUint64(c.homeSlot(h)) }

// prepare asks for h's home slot, to be written: a writer about to claim
// or release several hashes prepares a few ahead, so that their cache
// misses overlap and each compare-and-swap finds its line ready to write
// (a load ahead brought it only to read, and the swap waited for it again:
// results/README.md).
func (c *chainTable) prepare(h uint64) { prefetch.Write(c.homeSlot(h)) }

// prefetch loads, for hashes about to be looked up, their home slots, then
// the engine hashes of the blocks those slots name where the fingerprint
// is theirs, so that the lookups' cache misses overlap instead of following
// one another. The loads are atomic, or through keyOf, so not optimised
// away.
func (c *chainTable) prefetch(hs []uint64) {
	for _, h := range hs {
		c.peek(h)
	}
	for _, h := range hs {
		if v := c.peek(h); isEntry(v) && slotFP(v) == c.fingerprint(h) {
			c.keyOf(decode(v))
		}
	}
}

// probe looks for h in s: its location if found, else the first empty
// slot (-1 if none) and how many slots the probe passed to reach it. A
// pending claim is neither h nor empty.
func (c *chainTable) probe(s *chainSeg, h, fp, spare uint64) (loc uint64, empty, passed int, found bool) {
	loc, empty, passed, _, found, _ = c.probeFor(s, h, fp, spare)
	return loc, empty, passed, found
}

// probeFor is probe, with, for a claim (see claim), the first tombstone
// of h's tag the probe passed (own, -1 if none) and whether it passed an
// entry or a pending claim akin to h (kin).
func (c *chainTable) probeFor(s *chainSeg, h, fp, spare uint64) (loc uint64, empty, passed, own int, found, kin bool) {
	home := s.home(fp, spare)
	tomb := s.tomb(fp, spare)
	own = -1
	for i, n := home, 0; n < len(s.slots); i, n = s.next(i, home), n+1 {
		v := atomic.LoadUint64(&s.slots[i])
		if v == 0 {
			return 0, i, n, own, false, kin
		}
		if !akin(slotFP(v), fp) {
			continue
		}
		switch {
		case v == tomb:
			if own < 0 {
				own = i
			}
		case isTomb(v):
		case slotFP(v) == fp && isEntry(v):
			if k, ok := c.keyOf(decode(v)); ok && k == h {
				return decode(v), -1, n, own, true, kin
			}
			kin = true
		default:
			kin = true
		}
	}
	return 0, -1, len(s.slots), own, false, kin
}

// tombstoned reports whether the first n slots of the probe from home
// hold maxTombs tombstones. A probe passes many live entries too, in a
// grown segment near its split, and counting every probe's tombstones as
// it went made grown claims 3.7% slower, a second pass over every long
// probe 5.9% even when it stopped once the slots left could not make up
// the difference (results/README.md): so only a segment a release has
// left a tombstone in (tombed) is counted, in such a pass. s's count
// cannot tell: it samples by hash, and the few hashes stored and evicted
// again and again may all be uncounted.
func (s *chainSeg) tombstoned(home, n int) bool {
	return s.tombed.Load() && s.firstOf(home, n, maxTombs) >= 0
}

// reusable returns the tombstone a claim whose probe from home passed n
// slots takes: the first of them, where they hold reuseTombs tombstones
// (see reuseProbe); else -1.
func (s *chainSeg) reusable(home, n int) int {
	if n < reuseProbe || !s.tombed.Load() {
		return -1
	}
	return s.firstOf(home, n, reuseTombs)
}

// firstOf returns the first tombstone among the first n slots of the
// probe from home, where they hold want tombstones at least; else -1. It
// reads again what the probe read, in cache, and stops where the slots
// left cannot make up the difference.
func (s *chainSeg) firstOf(home, n, want int) int {
	first, t := -1, 0
	for i, k := home, 0; k < n; i, k = s.next(i, home), k+1 {
		if t+n-k < want {
			return -1
		}
		if isTomb(atomic.LoadUint64(&s.slots[i])) {
			if t == 0 {
				first = i
			}
			if t++; t == want {
				return first
			}
		}
	}
	return -1
}

// maxTombs is the tombstones a claim's probe may pass before it purges its
// segment of them (see purge). When claims took only empty slots, a hash
// stored and evicted again and again landed one slot further each time,
// and a probe for it passed all of its tombstones, up to nearly a
// segment's worth, until the segment's used slots grew it: workers storing
// and evicting the same 16 blocks (BenchmarkApplyParallel) took 16.9 us
// for 32 block operations, 3.7 times the ConcurrentTree's time, and 5.6
// with purges (claims now take tombstones: see reuseTombs). A purge
// rewrites a segment: at 32 tombstones they came
// often enough to triple a lock-free reader's p99 beside a writer trimming
// one run 100,000 times a second (BenchmarkTrimStorm), at 128 it rose 25%
// (at the trim rate the old table reached, the reader's p99 halved). The
// field's corpus purges nothing (results/README.md).
const maxTombs = 128

// claim makes loc the block h is claimed by, unless h already claims
// another (or loc cannot be encoded): whether loc is h's now.
//
// A claim takes the first tombstone of h's tag its probe passes (one a
// release of h, or of a hash of its tag, left: see chainSeg.tomb), else
// the probe's first empty slot, or its first tombstone where the probe
// passes many (see reuseTombs). A block evicted and stored again (an
// engine recomputing it) so takes back its hash's slot, and its probe
// stays as short as it was; taking empty slots instead, such a hash
// landed one slot further each time, past its own tombstones, up to
// reuseProbe slots (BenchmarkApplyParallel took twice the time:
// results/tombstone-tags.txt). Claims of one hash race for
// slots, and a claim taking an empty
// slot by compare-and-swap beats any other claim of h for it; but one
// taking a tombstone that another claim of h passed while it was an entry
// (an entry leaves no trace of the probes that passed it) would win
// beside the other's, at the empty slot past it. So a tombstone is taken
// in two steps: made pending, under h's fingerprint, then the entry, only
// if no other claim of h shows meanwhile (see contended); and a claim
// taking an empty slot looks back for claims pending before its slot
// (see rivalled). A split copies entries only: a claim checks for it
// after its slot becomes an entry, as before, and claims again in the
// segment after, where its entry may have been copied (see again). Most
// claims are settled in their home's line, their first step, without the
// rest of these checks (see lineFree).
func (c *chainTable) claim(h, loc uint64) bool {
	fp, spare := c.hashBits(h)
	v, ok := c.encode(fp, loc)
	if !ok {
		return false
	}
	for wrote := false; ; {
		s := c.segment(fp)
		home := s.home(fp, spare)
		var step claimStep
		if i, n, ok := s.lineFree(fp, home); ok {
			if c.hook != nil {
				c.hook(loc, claimProbed)
			}
			step = claimRetry // another claim took the slot: probe again
			if atomic.CompareAndSwapUint64(&s.slots[i], 0, v) {
				if !s.frozen.Load() && !c.counted(fp) {
					return true // tookEmpty's other checks are for counted entries and long or kin probes
				}
				step = c.tookEmpty(s, h, fp, spare, v, i, n, false)
			}
		} else {
			step = c.claimProbe(s, h, fp, spare, v, loc, home, wrote)
		}
		switch step {
		case claimWon:
			return true
		case claimLost:
			return false
		case claimWrote:
			wrote = true
		case claimRetry:
			continue
		}
		c.await(s, fp)
	}
}

// lineFree returns, where h's home line settles a claim of h in s, the
// slot it takes and the slots its probe passes to it: the line's first
// empty slot in probe order, if no slot before it is akin to fingerprint
// fp (see akin). Then h has no entry in s (an entry is never past an
// empty slot of its probe), no tombstone of h's tag lies on the way, and
// the probe is too short to take another tombstone (see reuseProbe) or to
// purge: probeFor, reusable and the rest of a claim's checks would find
// the same slot. It is their common case, without their general loop: a
// fresh store's claims and nearly all of the field's corpus's. A claim's
// compare-and-swap orders every load after it, so the instructions around
// it are on the path from one cache miss to the next: in a table of random
// hashes, with nothing else around them, claims took 9% less time with
// this shortcut, and 10% less again where the claim then returns without
// tookEmpty's call (results/claim-line.txt).
func (s *chainSeg) lineFree(fp uint64, home int) (slot, passed int, ok bool) {
	for n := range lineSlots {
		i := home&^(lineSlots-1) | (home+n)&(lineSlots-1) // the probe's order: see next
		v := atomic.LoadUint64(&s.slots[i])
		if v == 0 {
			return i, n, true
		}
		if akin(slotFP(v), fp) {
			break
		}
	}
	return 0, 0, false
}

// claimProbe is a step of a claim of h, as entry v, in s, where lineFree
// does not settle it: it probes s for h, and takes a tombstone or an empty
// slot for v. wrote: an earlier step's entry may have been copied into s
// by a split (see again).
func (c *chainTable) claimProbe(s *chainSeg, h, fp, spare, v, loc uint64, home int, wrote bool) claimStep {
	got, empty, passed, tomb, found, kin := c.probeFor(s, h, fp, spare)
	if tomb < 0 {
		tomb = s.reusable(home, passed)
	}
	if c.hook != nil {
		c.hook(loc, claimProbed)
	}
	switch {
	case found:
		if s.frozen.Load() {
			return claimAwait
		}
		mine := got == loc
		if wrote {
			mine = c.again(s, h, fp, spare, v, mine)
		}
		if mine {
			return claimWon
		}
		return claimLost
	case empty < 0: // full: only at the deepest directory (see the type)
		if !c.grow(s) {
			return claimLost
		}
		return claimAwait
	case passed >= maxTombs && s.tombstoned(home, passed) && c.purge(s):
		return claimAwait // s is being rebuilt without its tombstones: claim there
	case tomb >= 0:
		return c.claimTomb(s, h, fp, spare, v, tomb)
	case atomic.CompareAndSwapUint64(&s.slots[empty], 0, v):
		return c.tookEmpty(s, h, fp, spare, v, empty, passed, kin)
	}
	return claimRetry // another claim took the slot: probe again
}

// A claim whose probe passes reuseProbe slots before its first empty one
// looks among them for tombstones, and takes the first if they hold
// reuseTombs: the blocks a worker stores and evicts again and again line
// its probe with tombstones, and no longer land past all of them. Taking
// a tombstone costs a claim a second atomic write and a look at the rest
// of its probe (see claimTomb), and leaves a segment's tombstones to fill
// rather than to be purged by its next reshape; and looking costs a second
// pass over the probe. Most probes are shorter: at a line's worth of
// slots and of tombstones, or counting tombstones in every probe, the
// field's benchmark on a grown table ran 6-11% slower (6 of 6 rounds
// each), its segments filling to 7/8 between splits (results/README.md).
const (
	reuseProbe = 4 * lineSlots
	reuseTombs = reuseProbe / 2
)

// claimStep is what a step of a claim came to.
type claimStep uint8

const (
	claimAwait claimStep = iota // s is frozen (or reshaped): claim again in its replacement
	claimWrote                  // the same, where a split may have copied the claim's entry
	claimRetry                  // probe s again
	claimWon
	claimLost
)

// tookEmpty ends a claim of h whose entry v took the empty slot empty of
// s, passed slots into h's probe: it counts the entry and grows s where
// it is full, unless a rival shows (see rivalled) or s froze (a split may
// not have seen the entry: claim again in the next).
// kin: the probe passed a slot akin to h (see rivalled).
func (c *chainTable) tookEmpty(s *chainSeg, h, fp, spare, v uint64, empty, passed int, kin bool) claimStep {
	if s.frozen.Load() {
		return claimWrote
	}
	n := int64(0)
	if c.counted(fp) {
		n = s.count.Add(countWeight<<32 | countWeight)
	}
	if (passed >= reuseProbe || kin) && s.tombed.Load() {
		switch c.rivalled(s, h, fp, spare, empty) {
		case claimLost:
			c.release(h, decode(v))
			return claimLost
		case claimWrote:
			return claimWrote
		}
	}
	if n != 0 && used(n) > s.maxUsed()+int(s.ahead.Load()) && !c.recounted(s) {
		c.grow(s)
	}
	return claimWon
}

// rivalled looks back from a claim of h's entry at the empty slot mine of
// s to h's home, for a claim that took a tombstone the claim passed while
// it was an entry: claimLost if one of them is h's entry, after waiting
// out those of h's fingerprint pending (they wait on no claim of an
// empty slot); claimWrote if s froze meanwhile; else claimWon.
//
// Most claims need not look. Say a claim of h took an empty slot fewer
// than reuseProbe slots into h's probe, its probe passing no slot akin to
// h (see akin), and a rival of h won at a tombstone before that slot. The
// rival checked the slot empty (see contended), so its probe met it empty,
// fewer than reuseProbe slots in, and it took no tombstone but one of h's
// tag. The claim's probe did not meet that tombstone (it would have taken
// it), nor an entry or a pending claim akin to h there: so a claim of h's
// tag took the slot since and was released. With h's home, that claim too
// met the empty slot and took a tombstone of h's tag, which the claim's
// probe did not meet either, and so on back: there is no such rival. Nor
// has a claim in a segment no release has touched (tombed, set before its
// first tombstone): a table only ever filled (a fresh store) never looks.
func (c *chainTable) rivalled(s *chainSeg, h, fp, spare uint64, mine int) claimStep {
	home := s.home(fp, spare)
	for i := home; i != mine; i = s.next(i, home) {
		v := atomic.LoadUint64(&s.slots[i])
		if slotFP(v) != fp {
			continue
		}
		for isPending(v) {
			if s.frozen.Load() {
				return claimWrote
			}
			runtime.Gosched()
			v = atomic.LoadUint64(&s.slots[i])
		}
		if isEntry(v) {
			if k, ok := c.keyOf(decode(v)); ok && k == h {
				return claimLost
			}
		}
	}
	return claimWon
}

// claimTomb claims h for entry v at the tombstone free of s: pending
// first, then the entry, unless another claim shows (see contended).
func (c *chainTable) claimTomb(s *chainSeg, h, fp, spare, v uint64, free int) claimStep {
	pending := fp<<(slotIDBits+slotOffBits) | chainPending
	tomb := atomic.LoadUint64(&s.slots[free])
	if !isTomb(tomb) || !atomic.CompareAndSwapUint64(&s.slots[free], tomb, pending) {
		return claimRetry
	}
	if c.hook != nil {
		c.hook(decode(v), claimPended)
	}
	if s.frozen.Load() || c.contended(s, h, fp, spare, free) {
		atomic.StoreUint64(&s.slots[free], tomb) // give the slot up
		if s.frozen.Load() {
			return claimAwait
		}
		runtime.Gosched()
		return claimRetry
	}
	atomic.StoreUint64(&s.slots[free], v)
	if s.frozen.Load() {
		return claimWrote
	}
	if c.counted(fp) {
		s.count.Add(countWeight << 32) // the slot was used already
	}
	return claimWon
}

// contended reports whether a claim of h, pending at the tombstone mine
// of s, must give way: h's probe, to its first empty slot, holds an entry
// of h, or a claim of a hash of h's fingerprint pending at a lower slot
// (or s froze). It waits out those pending at a higher one: they give way
// or become entries, and wait on none below them, so none waits forever.
// Of two claims of h pending at once, at least the later one to mark its
// slot sees the other's mark: both cannot become entries. A claim of h
// at an empty slot past mine looks back (see rivalled).
func (c *chainTable) contended(s *chainSeg, h, fp, spare uint64, mine int) bool {
	home := s.home(fp, spare)
	for i, n := home, 0; n < len(s.slots); i, n = s.next(i, home), n+1 {
		v := atomic.LoadUint64(&s.slots[i])
		for i > mine && isPending(v) && slotFP(v) == fp && !s.frozen.Load() {
			runtime.Gosched()
			v = atomic.LoadUint64(&s.slots[i])
		}
		switch {
		case v == 0:
			return false
		case i == mine || slotFP(v) != fp:
		case isPending(v):
			return true // below mine, or s froze
		case isEntry(v):
			if k, ok := c.keyOf(decode(v)); ok && k == h {
				return true
			}
		}
	}
	return false
}

// again ends a claim of h for entry v that may have left v in a segment
// a split copied, on finding h's entry in s: v's (mine) or another's. A
// claim of h at another slot may have been copied beside it; so whatever
// it found, unless v is h's only entry there, the claim releases v
// (wherever splits took it) and loses. Two such claims may both lose:
// then no block is h's, which the index allows (a claim can be refused).
func (c *chainTable) again(s *chainSeg, h, fp, spare, v uint64, mine bool) bool {
	if mine {
		home := s.home(fp, spare)
		for i, n := home, 0; n < len(s.slots); i, n = s.next(i, home), n+1 {
			w := atomic.LoadUint64(&s.slots[i])
			if w == 0 {
				break
			}
			if w != v && isEntry(w) && slotFP(w) == fp {
				if k, ok := c.keyOf(decode(w)); ok && k == h {
					mine = false
					break
				}
			}
		}
		if mine {
			return true
		}
	}
	c.release(h, decode(v))
	return false
}

// release deletes h's entry if it is loc's.
func (c *chainTable) release(h, loc uint64) {
	fp, spare := c.hashBits(h)
	v, ok := c.encode(fp, loc)
	if !ok {
		return
	}
	for {
		s := c.segment(fp)
		home := s.home(fp, spare)
		for i, n := home, 0; n < len(s.slots); i, n = s.next(i, home), n+1 {
			w := atomic.LoadUint64(&s.slots[i])
			if w == 0 {
				break
			}
			if w != v {
				continue
			}
			if !s.tombed.Load() {
				s.tombed.Store(true) // before the tombstone (see rivalled)
			}
			if atomic.CompareAndSwapUint64(&s.slots[i], v, s.tomb(fp, spare)) {
				if c.counted(fp) && entries(s.count.Add(-countWeight<<32)) < s.mergeBelow() {
					c.merge(s)
				}
				break
			}
		}
		if !s.frozen.Load() {
			return
		}
		c.await(s, fp) // the split may have copied the entry
	}
}

// await waits until the directory no longer serves fp with s (frozen).
func (c *chainTable) await(s *chainSeg, fp uint64) {
	for {
		if c.segment(fp) != s {
			return
		}
		runtime.Gosched()
	}
}

// recounted reports whether s, whose count says it is full, is not: its
// used slots, counted now, are under nearFull. It then records
// how far the count ran ahead (ahead), so that the count says full again
// only once the slots used since make up the difference. A count sampled
// 1 in 16 is ~200 entries off a small segment's at full (one standard
// deviation), and so ran that far ahead for one in six: each was frozen
// and copied into a full-size segment (4% of a grown table's claims,
// profiled), where recounting makes the grown table's claims 6.6% faster
// (results/README.md). Counted without freezing s, whose slots change as
// it reads them, the count is within the few inserts made meanwhile.
func (c *chainTable) recounted(s *chainSeg) bool {
	n := 0
	for i := range s.slots {
		if atomic.LoadUint64(&s.slots[i]) != 0 {
			n++
		}
	}
	if n >= s.nearFull() {
		return false
	}
	s.ahead.Store(int32(used(s.count.Load()) - n))
	return true
}

func used(count int64) int    { return int(uint32(count)) }
func entries(count int64) int { return int(count >> 32) }

// grow makes room in s, unless another writer is doing so: it rebuilds
// s without its tombstones if they are most of what it holds, else grows
// a small segment whose entries are under 15/16 of its limit (tombstones
// filling the rest) to full size, or splits s in two small ones where
// that makes room (see splits), or else rebuilds it, crowded.
// False if s is crowded and still full of entries: a claim there finding
// no empty slot is refused, and its block's names are its workers' own.
func (c *chainTable) grow(s *chainSeg) bool { return c.reshape(s, s.maxUsed()/2) }

// purge rebuilds s at its size without its tombstones, where a claim's
// probe passed maxTombs of them, unless its entries are near filling it:
// then it grows s as grow does. False only if s is crowded and full of
// entries (the claim then inserts past the tombstones, as before); true if
// s is reshaped, by this writer or another.
func (c *chainTable) purge(s *chainSeg) bool { return c.reshape(s, s.nearFull()) }

// reshape is grow and purge: it rebuilds s at its size without its
// tombstones if it holds fewer than keep entries, and otherwise grows it.
func (c *chainTable) reshape(s *chainSeg, keep int) bool {
	if s.crowded && countLive(s) >= segMaxUsed || !s.frozen.CompareAndSwap(false, true) {
		return s.frozen.Load()
	}
	live, ones := census(s) // frozen: exact
	switch {
	case live < keep:
		c.publish([]*chainSeg{s}, []*chainSeg{c.rebuilt(s.depth, len(s.slots), s)})
	case len(s.slots) < segSlots && live < s.nearFull():
		c.publish([]*chainSeg{s}, []*chainSeg{c.rebuilt(s.depth, segSlots, s)})
	case !c.splits(s, live, ones):
		n := c.rebuilt(s.depth, segSlots, s)
		n.crowded = true
		c.publish([]*chainSeg{s}, []*chainSeg{n})
	default:
		parts := []*chainSeg{newSeg(s.depth+1, segSmall), newSeg(s.depth+1, segSmall)}
		shift := fpBits - 1 - s.depth
		s.each(func(v uint64) { c.put(parts[slotFP(v)>>shift&1], v) }) // no branch on the half
		c.publish([]*chainSeg{s}, parts)
	}
	return true
}

// Bounds on a directory's doubling (see splits): it may double while it
// has fewer than maxFreeDir slots (512 KiB), and past that while it has
// at most dirPerSeg slots a segment.
const (
	maxFreeDir = 1 << 16
	dirPerSeg  = 64
)

// splits reports whether splitting s (frozen, full size, holding live
// entries, ones of them for its second half: see census) makes room: each
// half must fit a small segment at most at the load at which it grows,
// and take at least an eighth of the entries; and a split that doubles
// the directory must leave it within its bounds.
// None fails by chance: the halves of a segment's random fingerprints
// differ by tens of entries, not thousands, and an honest table has about
// a segment a directory slot. An engine choosing its hashes could only
// fail them if it knew the table's multiplier (see hashBits). Without
// these checks, entries of one fingerprint past a small segment's slots
// made a split loop forever putting them in one half, and entries sharing
// ever longer prefixes doubled the directory at every split, to 2 GiB at
// the deepest.
func (c *chainTable) splits(s *chainSeg, live, ones int) bool {
	if s.depth == fpBits {
		return false
	}
	if max(ones, live-ones) > segSmall*7/8 || min(ones, live-ones) < live/8 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.dir.Load()
	return s.depth < d.depth || len(d.segs) < maxFreeDir || c.nsegs*dirPerSeg >= len(d.segs)
}

// merge joins s, left with few entries, with its buddy (the segment of the
// same depth whose fingerprints differ in their last directory bit) if
// they fit one small segment together, and so on up: memory is returned
// as entries are released. It gives up if either is being reshaped.
func (c *chainTable) merge(s *chainSeg) {
	for s.depth > 0 {
		b := c.buddy(s)
		if b == nil || b.spare && entries(b.count.Load()) >= b.mergeBelow() || entries(s.count.Load())+entries(b.count.Load()) >= segSmall/2 {
			return
		}
		if !s.frozen.CompareAndSwap(false, true) {
			return
		}
		if !b.frozen.CompareAndSwap(false, true) {
			c.publish([]*chainSeg{s}, []*chainSeg{c.rebuilt(s.depth, len(s.slots), s)})
			return
		}
		if countLive(s)+countLive(b) >= segSmall*7/8 { // inserts came meanwhile
			c.publish([]*chainSeg{s}, []*chainSeg{c.rebuilt(s.depth, len(s.slots), s)})
			c.publish([]*chainSeg{b}, []*chainSeg{c.rebuilt(b.depth, len(b.slots), b)})
			return
		}
		m := c.rebuilt(s.depth-1, segSmall, s, b)
		c.publish([]*chainSeg{s, b}, []*chainSeg{m})
		s = m
	}
}

// buddy returns the segment s would merge with, if it has one.
func (c *chainTable) buddy(s *chainSeg) *chainSeg {
	d := c.dir.Load()
	i := d.index(s)
	if i < 0 {
		return nil
	}
	shift := d.depth - s.depth
	b := d.segs[(i>>shift^1)<<shift].Load()
	if b.depth != s.depth {
		return nil
	}
	return b
}

// rebuilt returns a segment of the given depth and slots holding the
// entries of segs (frozen), without their tombstones.
func (c *chainTable) rebuilt(depth uint8, slots int, segs ...*chainSeg) *chainSeg {
	n := newSeg(depth, slots)
	for _, s := range segs {
		s.each(func(v uint64) { c.put(n, v) })
	}
	return n
}

// each calls fn for every entry of s.
func (s *chainSeg) each(fn func(v uint64)) {
	for i := range s.slots {
		if v := atomic.LoadUint64(&s.slots[i]); isEntry(v) {
			fn(v)
		}
	}
}

// put inserts entry v into s, not yet published and not reserved (its
// homes are its fingerprints'), with plain writes, and counts it as the
// count counts (see chainSeg): as it is built, in the pass that fills it,
// rather than in a second over its slots (a fresh grown table spent 6% of
// its stores recounting).
func (c *chainTable) put(s *chainSeg, v uint64) { c.place(s, v, s.home(slotFP(v), 0)) }

// place inserts entry v into s, unpublished, probing from home, and
// counts it (see put).
func (c *chainTable) place(s *chainSeg, v uint64, home int) {
	j := home
	for s.slots[j] != 0 {
		j = s.next(j, home)
	}
	s.slots[j] = v
	if c.counted(slotFP(v)) {
		s.count.Add(countWeight<<32 | countWeight)
	}
}

// countLive counts s's entries.
func countLive(s *chainSeg) int {
	live, _ := census(s)
	return live
}

// census counts s's entries, and those of them a split of s would put in
// its second half (see splits), in one pass. At the deepest, where no
// split parts a segment, ones means nothing.
func census(s *chainSeg) (live, ones int) {
	shift := max(fpBits-1-int(s.depth), 0)
	s.each(func(v uint64) {
		live++
		ones += int(slotFP(v) >> shift & 1)
	})
	return live, ones
}

// publish replaces olds (frozen, adjacent in the directory) by parts,
// which serve the same fingerprints: one segment for each, two one deeper
// for one, or one a level up for two. Only a split past the directory's
// depth (or the last reserved segment's going, which drops the slab)
// publishes a new directory, doubled; any other stores parts into the
// directory's slots in place. A grown table copied its directory on every
// reshape (16 KiB at 2,048 segments): in place, the grown fresh store with
// two writers is 4.6% faster (results/README.md). In place, a reader
// between two slots' stores may find one segment old and another new:
// each is one it could have found a moment before or after, and the old
// is frozen, so a writer there waits for the new one (await) as it did for
// a new directory.
func (c *chainTable) publish(olds, parts []*chainSeg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.dir.Load()
	slab := d.unreserve(olds)
	deeper := parts[len(parts)-1].depth > d.depth
	fresh := deeper || (slab == nil) != (d.slab == nil)
	if fresh {
		d = d.copied(deeper, slab)
	}
	first, span := len(d.segs), 0
	for _, o := range olds {
		first = min(first, d.index(o))
		span += 1 << (d.depth - o.depth)
	}
	for i := range span {
		d.segs[first+i].Store(parts[i*len(parts)/span])
	}
	if fresh {
		c.dir.Store(d)
	}
	c.nsegs += len(parts) - len(olds)
	if deeper && c.doubled != nil {
		c.doubled(c.nsegs)
	}
}

// copied returns a copy of d (under the table's mu), doubled if deeper,
// keeping slab.
func (d *chainDir) copied(deeper bool, slab []uint64) *chainDir {
	n := &chainDir{depth: d.depth, slab: slab, slabDepth: d.slabDepth, reserved: d.reserved}
	shift := 0
	if deeper {
		n.depth++
		shift = 1
	}
	n.segs = make([]atomic.Pointer[chainSeg], len(d.segs)<<shift)
	for i := range n.segs {
		n.segs[i].Store(d.segs[i>>shift].Load())
	}
	return n
}

// unreserve clears, in d (the directory, under mu), the bits of the
// reserved segments among olds, about to be replaced, and returns the slab
// the next directory keeps: none once no reserved segment is left, so
// that the slab's memory goes with the last of them.
func (d *chainDir) unreserve(olds []*chainSeg) []uint64 {
	if d.slab == nil {
		return nil
	}
	for _, o := range olds {
		if o.spare {
			k := d.index(o) >> (d.depth - d.slabDepth)
			d.reserved.bits[k/64].And(^uint64(1 << (k % 64)))
			d.reserved.live--
		}
	}
	if d.reserved.live == 0 {
		return nil
	}
	return d.slab
}
