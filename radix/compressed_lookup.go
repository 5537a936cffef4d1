package radix

import (
	mathbits "math/bits"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/kvradix/kvradix/kvevent"
)

// edgeKey mixes where a run hangs into its map key (murmur3's finaliser).
func (t *CompressedTree) edgeKey(parent *crun, off uint32, key uint64) uint64 {
	var ps uint64
	if parent != nil {
		ps = parent.serial
	}
	x := key ^ ps*0x9E3779B97F4A7C15 ^ uint64(off)*0xC2B2AE3D27D4EB4F
	x ^= x >> 33
	x *= 0xFF51AFD7ED558CCD
	x ^= x >> 33
	x *= 0xC4CEB9FE1A85EC53
	x ^= x >> 33
	return x & t.edgeMask
}

// child returns the run hanging from position off of parent whose first
// block is key, or nil.
func (t *CompressedTree) child(parent *crun, off uint32, key uint64) *crun {
	r, _ := t.heads.Load(t.edgeKey(parent, off, key))
	for r != nil && (r.parent != parent || r.parentOff != off || r.first != key) {
		r = r.collide.Load()
	}
	return r
}

// view returns the run's blocks as a reader may see them: a length read
// between two loads of the same array is a length of that array (a writer
// publishes a new array before the length that goes with it, and appends
// to an array only past every length published for it), so the blocks
// below it are written and stay put.
func (r *crun) view() []uint64 {
	for {
		p := r.keys.Load()
		n := r.n.Load()
		if r.keys.Load() == p {
			return (*p)[:min(int(n), len(*p))]
		}
	}
}

func (r *crun) holderArray() []holder {
	if p := r.holders.Load(); p != nil {
		return *p
	}
	return nil
}

type cmatchScratch struct {
	out     []Match
	active  []*xworker
	next    []*xworker
	score   []uint32 // per active worker: blocks matched in the current run
	dropped []wscore
}

type wscore struct {
	w     *xworker
	score uint32
}

// FindMatches implements Index; see AppendMatches.
func (t *CompressedTree) FindMatches(local []uint64, earlyExit bool) OverlapScores {
	t.ready()
	var first *crun
	if len(local) > 0 {
		first = t.child(nil, 0, local[0])
	}
	if first == nil {
		return newScores(0) // a miss: nobody holds the first block
	}
	s := t.scratch.Get().(*cmatchScratch)
	s.out = t.appendMatches(s, s.out[:0], local, first, earlyExit)
	res := newScores(len(s.out))
	for _, m := range s.out {
		res.Scores[m.Worker] = m.Score
		res.TreeSizes[m.Worker] = m.TreeSize
	}
	t.scratch.Put(s)
	return res
}

// SetGroup implements TierIndex (safe with readers and writers).
func (t *CompressedTree) SetGroup(holder kvevent.Worker, members []kvevent.Worker) {
	t.ready()
	t.groupsMu.Lock()
	defer t.groupsMu.Unlock()
	t.groups.Store(t.groups.Load().with(holder, members))
}

// FindTierMatches implements TierIndex. Which positions of a run a holder
// holds is the writers' (its bitset, under the run's lock; readers see only
// its cut), so this walk locks each run of the path in turn while it reads
// them: a tier query waits for the writers of those runs, as they wait for
// it, where FindMatches waits for nobody. In each run, a worker's prefix in
// tier t grows by the leading positions the union of its holders' bitsets
// (its own in t and nearer tiers, its groups') covers.
func (t *CompressedTree) FindTierMatches(local []uint64) TierScores {
	t.ready()
	g := t.groups.Load()
	tw := newTierWalk()
	var r *crun
	if len(local) > 0 {
		r = t.child(nil, 0, local[0])
	}
	byWorker := map[kvevent.Worker][]*holder{} // a run's holders, by their worker
	var union []uint64
	for depth := 0; r != nil && depth < len(local); {
		r.mu.Lock()
		if r.dead {
			r.mu.Unlock()
			break
		}
		m := commonPrefix(local[depth:], r.view())
		clear(byWorker)
		hs := r.holderArray()
		for i := range hs {
			w, _ := tierHolderOf(hs[i].w.worker)
			byWorker[w] = append(byWorker[w], &hs[i])
		}
		if depth == 0 && m > 0 {
			for w, hh := range byWorker {
				for _, h := range hh {
					if h.has(0) {
						tw.start(w, g)
						for _, mb := range g.membersOf(w) {
							tw.start(mb, g)
						}
					}
				}
			}
		}
		growing := m > 0 && tw.run(depth, m, func(w kvevent.Worker, tier int) uint32 {
			union = union[:0]
			add := func(hh []*holder) {
				for _, h := range hh {
					if _, ht := tierHolderOf(h.w.worker); int(ht) <= tier {
						union = orInto(union, h.bits)
					}
				}
			}
			add(byWorker[w])
			for _, hd := range g.holdersOf(w) {
				add(byWorker[hd])
			}
			return leadingOnes(union, uint32(m))
		})
		// The child is looked up under r's lock, where r's first m blocks
		// are the ones just read. Once locked, a child still live hangs
		// there still: a run is never trimmed below a child.
		depth += m
		var child *crun
		if growing && depth < len(local) {
			child = t.child(r, uint32(m-1), local[depth])
		}
		r.mu.Unlock()
		t.at(hookTierStep)
		r = child
	}
	res := tw.finish()
	for w := range res.Scores {
		for _, tier := range kvevent.Tiers {
			if xw, _ := t.workers.Load(tierHolder(w, tier)); xw != nil {
				res.TreeSizes[w] += int(xw.size.Load())
			}
		}
	}
	return res
}

// orInto ORs src into dst, growing it.
func orInto(dst, src []uint64) []uint64 {
	for len(dst) < len(src) {
		dst = append(dst, 0)
	}
	for i, w := range src {
		dst[i] |= w
	}
	return dst
}

// leadingOnes counts the leading set bits of a bitset, at most m.
func leadingOnes(b []uint64, m uint32) uint32 {
	n := uint32(0)
	for _, w := range b {
		if w != ^uint64(0) {
			n += uint32(mathbits.TrailingZeros64(^w))
			return min(n, m)
		}
		n += 64
		if n >= m {
			return m
		}
	}
	return min(n, m)
}

// Match is one worker's result of matching a request.
type Match struct {
	Worker   kvevent.Worker
	Score    uint32 // leading blocks of the request it holds
	TreeSize int    // blocks it holds in the whole index
}

// AppendMatches appends to dst the match of every worker holding at least
// the request's first block (in no particular order): FindMatches without
// the maps, and without allocating. It walks the request run by run: one
// map load per run, a memequal of the request against the run's blocks,
// and one cut per active worker.
func (t *CompressedTree) AppendMatches(dst []Match, local []uint64, earlyExit bool) []Match {
	t.ready()
	if len(local) == 0 {
		return dst
	}
	first := t.child(nil, 0, local[0])
	if first == nil {
		return dst
	}
	s := t.scratch.Get().(*cmatchScratch)
	dst = t.appendMatches(s, dst, local, first, earlyExit)
	t.scratch.Put(s)
	return dst
}

// appendMatches walks local from r, the run its first block starts.
func (t *CompressedTree) appendMatches(s *cmatchScratch, dst []Match, local []uint64, r *crun, earlyExit bool) []Match {
	active, dropped := s.active[:0], s.dropped[:0]
	depth := 0
	for first := true; r != nil; first = false {
		var m int
		var score []uint32
		var child *crun
		m, child, active, score = t.scoreRun(r, local[depth:], first, active, s.score[:0])
		s.score = score
		next, stop := s.next[:0], false
		if lead, runnerUp := leaders(score); earlyExit && lead >= 0 && score[lead] > runnerUp {
			// The walk the plain tree does stops once one worker is left:
			// at the runner-up's last block.
			for i, w := range active {
				if i == lead {
					dropped = append(dropped, wscore{w, uint32(depth) + runnerUp + 1})
				} else {
					dropped = append(dropped, wscore{w, uint32(depth) + score[i]})
				}
			}
			stop = true
		} else {
			for i, w := range active {
				if score[i] == uint32(m) {
					next = append(next, w)
				} else {
					dropped = append(dropped, wscore{w, uint32(depth) + score[i]})
				}
			}
		}
		s.next, active = active, next
		depth += m
		if stop || len(active) == 0 || depth == len(local) {
			break
		}
		r = child
	}
	for _, d := range dropped {
		if d.w.worker.DPRank < 1<<tierShift { // a holder of another tier is not the device's
			dst = append(dst, Match{d.w.worker, d.score, int(d.w.size.Load())})
		}
	}
	for _, w := range active {
		if w.worker.DPRank < 1<<tierShift {
			dst = append(dst, Match{w.worker, uint32(depth), int(w.size.Load())})
		}
	}
	// Drop the references to workers, so a removed one can be collected.
	clear(active[:cap(active)])
	clear(s.next[:cap(s.next)])
	clear(dropped[:cap(dropped)])
	s.active, s.dropped = active[:0], dropped[:0]
	return dst
}

// optimisticReads is how many times a reader reads a run without its lock
// before it takes the lock to read it once: a reader racing a storm of
// trims then waits for one writer, not for the storm to pass.
const optimisticReads = 2

// checkEvery is how many holders a reader reads between two looks at the
// run's version, so that a read spoilt by a trim is given up early.
const checkEvery = 512

// scoreRun compares the rest of a request with r's blocks, appends to
// score each worker's blocks matched there (every holder with a cut, made
// active, in the first run; each active worker after), and returns the
// blocks matched and the run the request goes on in (nil if none, or if no
// worker holds the whole match). It reads all of it within one version of
// r: the blocks, the cuts, and the child run hanging from the last block
// matched. A trim in between (after which the run may regrow with other
// blocks, cuts count those, and children hang from those) makes it read
// them again; after optimisticReads tries, under r's lock.
func (t *CompressedTree) scoreRun(r *crun, rest []uint64, first bool, active []*xworker, score []uint32) (int, *crun, []*xworker, []uint32) {
	base := len(active)
	for try := 1; ; try++ {
		locked := try > optimisticReads
		if locked {
			r.mu.Lock()
		}
		v := r.ver.Load()
		m := commonPrefix(rest, r.view())
		hs := r.holderArray()
		active, score = active[:base], score[:0]
		if first {
			// A run with many holders: a read the version has already
			// spoilt is given up between two chunks.
			for lo := 0; lo < len(hs); lo += checkEvery {
				active, score = activeIn(active, score, hs[lo:min(lo+checkEvery, len(hs))], uint32(m))
				if !locked && r.ver.Load() != v {
					break
				}
			}
		} else {
			score = cutsOf(score, active, hs, uint32(m))
		}
		if !locked {
			t.at(hookScored)
		}
		var child *crun
		if m > 0 && m < len(rest) && slices.Contains(score, uint32(m)) {
			child = t.child(r, uint32(m-1), rest[m])
		}
		if locked {
			r.mu.Unlock()
			return m, child, active, score
		}
		if r.ver.Load() == v {
			return m, child, active, score
		}
	}
}

// activeIn appends each holder of hs with a cut, and its cut (at most m).
func activeIn(active []*xworker, score []uint32, hs []holder, m uint32) ([]*xworker, []uint32) {
	for i := range hs {
		if c := min(atomic.LoadUint32(&hs[i].cut), m); c > 0 {
			active = append(active, hs[i].w)
			score = append(score, c)
		}
	}
	return active, score
}

// cutsOf appends, for each active worker, how many of the run's first m
// blocks it holds (0 if it is not among hs); both are sorted by slot.
func cutsOf(dst []uint32, active []*xworker, hs []holder, m uint32) []uint32 {
	j := 0
	for _, w := range active {
		for j < len(hs) && hs[j].w.slot < w.slot {
			j++
		}
		c := uint32(0)
		if j < len(hs) && hs[j].w == w {
			c = min(atomic.LoadUint32(&hs[j].cut), m)
		}
		dst = append(dst, c)
	}
	return dst
}

// leaders returns the index of the highest score (-1 if none) and the
// second highest score (0 if fewer than two).
func leaders(score []uint32) (lead int, runnerUp uint32) {
	lead = -1
	for i, s := range score {
		switch {
		case lead < 0 || s > score[lead]:
			if lead >= 0 {
				runnerUp = score[lead]
			}
			lead = i
		case s > runnerUp:
			runnerUp = s
		}
	}
	return lead, runnerUp
}

// commonPrefix returns how many leading elements a and b share.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	a, b = a[:n], b[:n]
	if asBytes(a) == asBytes(b) {
		return n
	}
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

func asBytes(s []uint64) string {
	return unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s))
}
