package radix

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/kvradix/kvradix/kvevent"
)

// TreeInvariants checks the tree's structure: links agree both ways, no
// empty childless node stays linked, and the worker maps match the nodes.
func TreeInvariants(t *Tree) error {
	pairs := 0
	var walk func(n *node) error
	walk = func(n *node) error {
		for k, c := range n.children {
			if c.parent != n || c.key != k {
				return fmt.Errorf("child %x badly linked", k)
			}
			if len(c.workers) == 0 && len(c.children) == 0 {
				return fmt.Errorf("empty childless node %x left linked", k)
			}
			for w, aliases := range c.workers {
				pairs++
				var names tierCount
				if tw := t.workers[w]; tw != nil {
					for _, m := range tw.names {
						for _, tier := range kvevent.Tiers {
							if m.n == c && m.tiers.Has(tier) {
								names[tier]++
							}
						}
					}
				}
				if names != aliases || names.set() == 0 {
					return fmt.Errorf("worker %v in node %x counts %v aliases by tier, is named by %v hashes", w, k, aliases, names)
				}
			}
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(t.root); err != nil {
		return err
	}
	if len(t.root.workers) != 0 {
		return fmt.Errorf("root holds workers")
	}
	n, distinctNodes := 0, 0
	for w, tw := range t.workers {
		var distinct [kvevent.NumTiers]map[*node]bool
		all := map[*node]bool{}
		for h, m := range tw.names {
			if _, ok := m.n.workers[w]; !ok || m.tiers == 0 {
				return fmt.Errorf("worker %v hash %x names a node it is not in (tiers %b)", w, h, m.tiers)
			}
			all[m.n] = true
			for _, tier := range kvevent.Tiers {
				if m.tiers.Has(tier) {
					if distinct[tier] == nil {
						distinct[tier] = map[*node]bool{}
					}
					distinct[tier][m.n] = true
				}
			}
		}
		for _, tier := range kvevent.Tiers {
			if int(tw.nodes[tier]) != len(distinct[tier]) {
				return fmt.Errorf("worker %v counts %d nodes in tier %v, names %d", w, tw.nodes[tier], tier, len(distinct[tier]))
			}
			n += len(distinct[tier])
		}
		distinctNodes += len(all)
	}
	if distinctNodes != pairs || n != t.size {
		return fmt.Errorf("%d named nodes, %d memberships, %d tier memberships, size %d", distinctNodes, pairs, n, t.size)
	}
	return nil
}

// TreeNodes counts the nodes linked below the root.
func TreeNodes(t *Tree) int {
	var count func(n *node) int
	count = func(n *node) int {
		c := 0
		for _, ch := range n.children {
			c += 1 + count(ch)
		}
		return c
	}
	return count(t.root)
}

// ConcurrentInvariants checks a quiescent ConcurrentTree: every node has
// workers or children, child counts and parents agree, and the workers'
// maps name exactly the memberships.
func ConcurrentInvariants(t *ConcurrentTree) (nodes int, err error) {
	children := map[uint64]int32{}
	members := 0
	t.nodes.Range(func(k uint64, n cnode) bool {
		nodes++
		var buf [1]uint32
		ss := n.slots(&buf)
		if n.multi != nil && (len(ss) < 2 || !slices.IsSorted(ss)) {
			err = fmt.Errorf("node %x has a bad slot array %v", k, ss)
			return false
		}
		if len(ss) == 0 && n.children == 0 {
			err = fmt.Errorf("node %x is empty and childless", k)
			return false
		}
		if n.parent != rootKey {
			if _, ok := t.nodes.Load(n.parent); !ok {
				err = fmt.Errorf("node %x has no parent", k)
				return false
			}
			children[n.parent]++
		}
		if childKey(n.parent, localOf(k, n.parent)) != k {
			err = fmt.Errorf("node %x does not invert", k)
			return false
		}
		members += len(ss)
		return true
	})
	if err != nil {
		return nodes, err
	}
	t.nodes.Range(func(k uint64, n cnode) bool {
		if n.children != children[k] {
			err = fmt.Errorf("node %x counts %d children, has %d", k, n.children, children[k])
		}
		return err == nil
	})
	pairs := 0
	t.workers.Range(func(w kvevent.Worker, cw *cworker) bool {
		names := map[uint64]uint32{}
		for _, k := range cw.lookup {
			n, ok := t.nodes.Load(k)
			var buf [1]uint32
			if _, found := slices.BinarySearch(n.slots(&buf), cw.slot); !ok || !found {
				err = fmt.Errorf("worker %v names node %x it is not in", w, k)
				return false
			}
			names[k]++
		}
		if err = checkAliases(w, names, cw.aliases); err != nil {
			return false
		}
		if int(cw.size.Load()) != len(names) {
			err = fmt.Errorf("worker %v size %d, names %d nodes", w, cw.size.Load(), len(names))
		}
		pairs += len(names)
		return err == nil
	})
	if err == nil && (pairs != members || pairs != t.Size()) {
		err = fmt.Errorf("%d hashes, %d memberships, size %d", pairs, members, t.Size())
	}
	return nodes, err
}

// checkAliases checks that a worker's alias counts are the hashes naming
// each node beyond the first, with no entry for a node named once.
func checkAliases(w kvevent.Worker, names, aliases map[uint64]uint32) error {
	for k, n := range names {
		if aliases[k] != n-1 {
			return fmt.Errorf("worker %v: node %v named by %d hashes, %d aliases counted", w, k, n, aliases[k])
		}
	}
	for k, a := range aliases {
		if _, ok := names[k]; !ok || a == 0 {
			return fmt.Errorf("worker %v: %d aliases counted for node %v it does not name", w, a, k)
		}
	}
	return nil
}

// CNodeSize is the size of a ConcurrentTree node, held by value in the
// map's entries.
const CNodeSize = unsafe.Sizeof(cnode{})

// NewCompressedTreeColliding returns a CompressedTree whose edge keys take
// only four values, so nearly every lookup walks a collision chain, and
// which makes a child run for every block stored past the length a run
// was trimmed to, other than the one it held there (copyLimit 0).
func NewCompressedTreeColliding() *CompressedTree {
	t := NewCompressedTree()
	t.edgeMask, t.copyLimit = 3, 0
	return t
}

// NewCompressedTreeCramped returns a CompressedTree whose runs end after 3
// blocks (a path goes on in child runs), as do those trimmed (copyLimit
// 0), and whose engine-hash table takes only the blocks of runs 1 to 3:
// the blocks of every later run are named by the workers' own names, as
// past 2^22 runs.
func NewCompressedTreeCramped() *CompressedTree {
	t := NewCompressedTree()
	t.runLimit, t.chain.ids, t.copyLimit = 3, 4, 0
	return t
}

// NewCompressedTreeKnownMult returns a CompressedTree whose engine-hash
// table's multiplier is the Fibonacci one, as if an engine knew it:
// FibHash(fp, x) then has fingerprint fp.
func NewCompressedTreeKnownMult() *CompressedTree {
	t := NewCompressedTree()
	t.chain.mult = fibMult
	return t
}

// FibHash is fibHash, for the external tests.
func FibHash(fp, low uint64) uint64 { return fibHash(fp, low) }

// FPBits is the bits of a fingerprint.
const FPBits = fpBits

// ChainDirSlots returns the slots of t's table's directory.
func ChainDirSlots(t *CompressedTree) int { return len(t.chain.dir.Load().segs) }

// CompressedInvariants checks a quiescent CompressedTree: every run is
// reachable where it hangs, holds someone or has children, is exactly as
// long as what is needed of it; holders' cuts, tops and counts agree with
// their bitsets; and the workers' tables name exactly the held positions.
func CompressedInvariants(t *CompressedTree) (runs int, err error) {
	t.ready()
	kids := map[*crun]map[uint32]uint32{}
	serials := map[uint64]bool{}
	members := 0
	var all []*crun
	t.runs.each(func(r *crun) { all = append(all, r) })
	for _, r := range all {
		runs++
		id := r.id
		if r.dead || t.runs.get(id) != r {
			return runs, fmt.Errorf("run %d is dead or registered elsewhere", id)
		}
		if serials[r.serial] {
			return runs, fmt.Errorf("run %d: serial %d taken", id, r.serial)
		}
		serials[r.serial] = true
		if t.child(r.parent, r.parentOff, r.first) != r {
			return runs, fmt.Errorf("run %d is not found where it hangs", id)
		}
		if p := r.parent; p != nil {
			if t.runs.get(p.id) != p || p.dead {
				return runs, fmt.Errorf("run %d hangs from a deleted run", id)
			}
			if r.parentOff >= p.n.Load() {
				return runs, fmt.Errorf("run %d hangs past its parent's end", id)
			}
			if int(r.parentOff)+1 < len(p.view()) && p.view()[r.parentOff+1] == r.first {
				return runs, fmt.Errorf("run %d duplicates its parent's next block", id)
			}
			if kids[p] == nil {
				kids[p] = map[uint32]uint32{}
			}
			kids[p][r.parentOff]++
		}
		if r.view()[0] != r.first {
			return runs, fmt.Errorf("run %d: first block %x, edge says %x", id, r.view()[0], r.first)
		}
		if r.hw < r.n.Load() || int(r.hw) > len(*r.keys.Load()) {
			return runs, fmt.Errorf("run %d: published %d of an array of %d, length %d", id, r.hw, len(*r.keys.Load()), r.n.Load())
		}
		if err := claimsOf(t, r); err != nil {
			return runs, err
		}
		hs := r.holderArray()
		for i := range hs {
			h := &hs[i]
			if _, ok := h.w.runs[r]; !ok {
				return runs, fmt.Errorf("run %d: worker %v holds it, does not list it", id, h.w.worker)
			}
			if i > 0 && hs[i-1].w.slot >= h.w.slot {
				return runs, fmt.Errorf("run %d: holders not sorted by slot", id)
			}
			if xw, _ := t.workers.Load(h.w.worker); xw != h.w {
				return runs, fmt.Errorf("run %d holds forgotten worker %v", id, h.w.worker)
			}
			cnt := uint32(0)
			for _, w := range h.bits {
				cnt += uint32(bits.OnesCount64(w))
			}
			cut := uint32(0)
			for h.has(cut) {
				cut++
			}
			if cnt != h.held || cnt == 0 || h.top != highestBit(h.bits) || h.cut != cut || h.top > r.n.Load() {
				return runs, fmt.Errorf("run %d worker %v: held %d/%d top %d/%d cut %d/%d n %d", id, h.w.worker, h.held, cnt, h.top, highestBit(h.bits), h.cut, cut, r.n.Load())
			}
			if h.w.plain() {
				for p := range h.top {
					if h.has(p) && !hasBit(r.claimed, p) {
						return runs, fmt.Errorf("run %d: plain worker %v holds unclaimed block %d", id, h.w.worker, p)
					}
				}
			}
			members += int(cnt)
		}
		if len(hs) == 0 && r.kidsExtent() == 0 {
			return runs, fmt.Errorf("run %d is empty and childless", id)
		}
		if r.extent() != r.n.Load() {
			return runs, fmt.Errorf("run %d: length %d, needed %d", id, r.n.Load(), r.extent())
		}
	}
	for _, r := range all {
		want, counted := kids[r], 0
		var ks kidSet
		if p := r.kids.Load(); p != nil {
			ks = *p
		}
		for i, k := range ks {
			if i > 0 && ks[i-1].off >= k.off {
				return runs, fmt.Errorf("run %d: children's positions not sorted", r.id)
			}
			n := k.n.Load()
			if n < 0 || n != int32(want[k.off]) {
				return runs, fmt.Errorf("run %d counts %d children at %d, has %d", r.id, n, k.off, want[k.off])
			}
			if n > 0 {
				counted++
			}
		}
		if counted != len(want) {
			return runs, fmt.Errorf("run %d counts children at %d positions, has %d", r.id, counted, len(want))
		}
	}
	pairs := 0
	t.workers.Range(func(w kvevent.Worker, xw *xworker) bool {
		pairs += int(xw.size.Load())
		err = namesOf(t, w, xw)
		return err == nil
	})
	if err != nil {
		return runs, err
	}
	if claimed, entries := claimedCount(t), chainEntries(t); claimed != entries {
		return runs, fmt.Errorf("%d blocks claim their hash, the table has %d entries: %s", claimed, entries, strayEntries(t))
	}
	if pairs != members || pairs != t.Size() {
		return runs, fmt.Errorf("%d hashes, %d memberships, size %d", pairs, members, t.Size())
	}
	if n := t.heads.Size(); n > runs {
		return runs, fmt.Errorf("%d map entries for %d runs", n, runs)
	}
	return runs, nil
}

// claimsOf checks r's own hashes: a claimed position is found by its hash
// in the table, and no claim lies past the run's end.
func claimsOf(t *CompressedTree, r *crun) error {
	n, eng := r.n.Load(), *r.eng.Load()
	if len(eng) != len(*r.keys.Load()) {
		return fmt.Errorf("run %d: %d own hashes for %d blocks' room", r.id, len(eng), len(*r.keys.Load()))
	}
	for off := range uint32(64 * len(r.claimed)) {
		if !hasBit(r.claimed, off) {
			continue
		}
		if off >= n {
			return fmt.Errorf("run %d claims position %d past its length %d", r.id, off, n)
		}
		if loc, ok := t.chain.find(eng[off]); !ok || loc != pack(r, off) {
			return fmt.Errorf("run %d position %d claims %#x, the table has it at %#x (%v)", r.id, off, eng[off], loc, ok)
		}
	}
	return nil
}

func claimedCount(t *CompressedTree) int {
	n := 0
	t.runs.each(func(r *crun) {
		for _, w := range r.claimed {
			n += bits.OnesCount64(w)
		}
	})
	return n
}

// loaded returns d's segments, slot by slot.
func (d *chainDir) loaded() []*chainSeg {
	segs := make([]*chainSeg, len(d.segs))
	for i := range segs {
		segs[i] = d.segs[i].Load()
	}
	return segs
}

// strayEntries describes the table's entries no block claims.
func strayEntries(t *CompressedTree) string {
	var out []string
	seen := map[*chainSeg]bool{}
	for _, s := range t.chain.dir.Load().loaded() {
		if seen[s] {
			continue
		}
		seen[s] = true
		s.each(func(v uint64) {
			loc := decode(v)
			r, off := t.unpack(loc)
			switch {
			case r == nil:
				out = append(out, fmt.Sprintf("%#x: no run", loc))
			case !hasBit(r.claimed, off):
				out = append(out, fmt.Sprintf("%#x: run %d (n %d, dead %v) does not claim %d", loc, r.id, r.n.Load(), r.dead, off))
			}
		})
	}
	return strings.Join(out, "; ")
}

// MaxTombs is the tombstones a claim's probe passes before it purges its
// segment.
const MaxTombs = maxTombs

// ChainTombRun returns the most tombstones a probe for one of t's table
// entries passes before reaching it.
func ChainTombRun(t *CompressedTree) int {
	most, seen := 0, map[*chainSeg]bool{}
	for _, s := range t.chain.dir.Load().loaded() {
		if seen[s] {
			continue
		}
		seen[s] = true
		s.each(func(v uint64) {
			h, ok := t.chain.keyOf(decode(v))
			if !ok {
				return
			}
			fp, spare := t.chain.hashBits(h)
			if _, _, passed, found := t.chain.probe(s, h, fp, spare); found {
				most = max(most, countTombs(s, s.home(fp, spare), passed))
			}
		})
	}
	return most
}

// ChainEntries is the number of engine hashes the table holds.
func ChainEntries(t *CompressedTree) int { return chainEntries(t) }

func chainEntries(t *CompressedTree) int {
	n, seen := 0, map[*chainSeg]bool{}
	for _, s := range t.chain.dir.Load().loaded() {
		if !seen[s] {
			seen[s] = true
			n += countLive(s)
		}
	}
	return n
}

// namesOf checks a worker's names: each names a block the worker holds,
// its own names are counted per block, a block held but not by its own
// hash is marked so, and its size is the blocks it holds.
func namesOf(t *CompressedTree, w kvevent.Worker, xw *xworker) error {
	if xw.worker != w || xw.size.Load() <= 0 {
		return fmt.Errorf("worker %v registered with %d blocks", w, xw.size.Load())
	}
	held, own := map[uint64]bool{}, map[uint64]bool{}
	for r := range xw.runs {
		hs := r.holderArray()
		i, found := holderOf(hs, xw)
		if !found {
			return fmt.Errorf("worker %v lists run %d, holds nothing there", w, r.id)
		}
		for off := range hs[i].top {
			if hs[i].has(off) {
				held[pack(r, off)] = true
			}
		}
	}
	if int(xw.size.Load()) != len(held) {
		return fmt.Errorf("worker %v size %d, holds %d blocks", w, xw.size.Load(), len(held))
	}
	counts := map[uint64]uint32{}
	var err error
	t.eachName(xw, func(h, loc uint64) {
		if x, ok := xw.xnames[h]; ok && x == loc {
			counts[loc]++
		} else {
			own[loc] = true
			if l, ok := t.chain.find(h); err == nil && (!ok || l != loc) {
				err = fmt.Errorf("worker %v names %#x by its own hash %#x, which the table has at %#x", w, loc, h, l)
			}
		}
		if err == nil && !held[loc] {
			err = fmt.Errorf("worker %v hash %x names a block it does not hold", w, h)
		}
	})
	if err != nil {
		return err
	}
	for loc := range held {
		want := counts[loc]
		if !own[loc] {
			want |= noOwn
		}
		if xw.xcount[loc] != want || want == noOwn {
			return fmt.Errorf("worker %v block %#x: count %#x, want %#x (own %v)", w, loc, xw.xcount[loc], want, own[loc])
		}
	}
	for loc := range xw.xcount {
		if !held[loc] {
			return fmt.Errorf("worker %v counts names of %#x, does not hold it", w, loc)
		}
	}
	return nil
}

// ConcurrentJoinUnder makes w hold the node of tokens hash local under the
// parent key, whether or not a node has that key.
func ConcurrentJoinUnder(t *ConcurrentTree, w kvevent.Worker, local, parent uint64) {
	t.ready()
	t.join(childKey(parent, local), parent, t.worker(w))
}

// ConcurrentLeave makes w leave the node ConcurrentJoinUnder joined.
func ConcurrentLeave(t *ConcurrentTree, w kvevent.Worker, local, parent uint64) {
	cw, _ := t.workers.Load(w)
	t.leave(childKey(parent, local), cw)
}

// ConcurrentHasNode reports whether a node has the key.
func ConcurrentHasNode(t *ConcurrentTree, key uint64) bool {
	_, ok := t.nodes.Load(key)
	return ok
}

// StripeRemembers reports whether w's writer stripe still points at a
// state of w's: the last worker its events named, or where a removal left
// one.
func StripeRemembers(t *CompressedTree, w kvevent.Worker) bool {
	st := t.stripe(w.ID)
	return (st.last != nil && st.last.worker == w) || (st.left.xw != nil && st.left.xw.worker == w)
}

// TipSlots returns how many tips w's state keeps (0: none yet).
func TipSlots(t *CompressedTree, w kvevent.Worker) int {
	if xw, _ := t.workers.Load(w); xw != nil && xw.tips != nil {
		return len(xw.tips.slots)
	}
	return 0
}

// Padded layouts: a writer stripe fills two cache lines and a root stripe
// one, so that writers of different stripes share none.
const (
	WriterStripeSize = unsafe.Sizeof(writerStripe{})
	PaddedMutexSize  = unsafe.Sizeof(paddedMutex{})
)

// Hook points of a CompressedTree (see SetCompressedHook).
const (
	HookScored   = hookScored
	HookTierStep = hookTierStep
	HookSettled  = hookSettled
	HookDescend  = hookDescend
	HookBranch   = hookBranch
	HookLeave    = hookLeave
	HookFirstKid = hookFirstKid
)

// SetCompressedHook makes t call fn at each hook point, before any reader
// or writer runs.
func SetCompressedHook(t *CompressedTree, fn func(hookPoint)) { t.hook = fn }

// LockTopRun locks the top-level run whose first block is key, and its
// root stripe, as a walk from the root holds them; it returns their
// unlock.
func LockTopRun(t *CompressedTree, key uint64) (unlock func()) {
	root := t.rootLock(key)
	root.Lock()
	r := t.child(nil, 0, key)
	r.mu.Lock()
	return func() {
		r.mu.Unlock()
		root.Unlock()
	}
}

// LockRunOf locks the run holding the last block of the path keys (tokens
// hashes from the root); it returns the unlock.
func LockRunOf(t *CompressedTree, keys ...uint64) (unlock func()) {
	r := runOf(t, keys)
	r.mu.Lock()
	return r.mu.Unlock
}

// RunRoom is the length of the arrays of the run holding the last block
// of the path keys.
func RunRoom(t *CompressedTree, keys ...uint64) int {
	return len(*runOf(t, keys).keys.Load())
}

// RunArray is the address of the keys array of the run holding the last
// block of the path keys: it changes when the run is copied.
func RunArray(t *CompressedTree, keys ...uint64) *uint64 {
	return unsafe.SliceData(*runOf(t, keys).keys.Load())
}

// KidPositions is how many positions the run holding the last block of
// the path keys keeps counts of children for, those at zero included.
func KidPositions(t *CompressedTree, keys ...uint64) int {
	if ks := runOf(t, keys).kids.Load(); ks != nil {
		return len(*ks)
	}
	return 0
}

// SpareRunIDs is the most run ids the writer stripes hold spare, and
// RunIDBatch how many they take at once (see runTable).
const (
	SpareRunIDs = 2 * idBatch * writerStripes
	RunIDBatch  = idBatch
)

// RunIDs is how many run ids the tree has handed out, and how many runs
// are live.
func RunIDs(t *CompressedTree) (handed, live int) {
	t.runs.mu.Lock()
	defer t.runs.mu.Unlock()
	t.runs.each(func(*crun) { live++ })
	return int(t.runs.next), live
}

func runOf(t *CompressedTree, keys []uint64) *crun {
	r, off := t.child(nil, 0, keys[0]), uint32(0)
	for _, k := range keys[1:] {
		if ks := r.view(); int(off)+1 < len(ks) && ks[off+1] == k {
			off++
		} else {
			r, off = t.child(r, off, k), 0
		}
	}
	return r
}

// HookPoint is a place where a test may interleave events (see
// SetCompressedHook).
type HookPoint = hookPoint

// RaceEnabled reports whether the race detector is on (see raceEnabled).
const RaceEnabled = raceEnabled

// ReserveWait resizes t as Reserve does, without its warm, and returns how
// long t's writers waited for it (false if it did not resize).
func (t *CompressedTree) ReserveWait(blocks int) (time.Duration, bool) {
	d := t.newReserved(blocks)
	if d == nil {
		return 0, false
	}
	start := time.Now()
	ok := t.adopt(d)
	return time.Since(start), ok
}
