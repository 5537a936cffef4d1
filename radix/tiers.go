package radix

import (
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/kvradix/kvradix/kvevent"
)

// An index made of per-worker holders (ConcurrentTree) keeps tiers by
// giving each (worker, non-device tier) a holder of its own: the worker
// with the tier in the rank's top two bits. Device holders are the workers
// themselves, so device streams are unchanged; ranks stay below
// 2^tierShift (kvevent.MaxDPRank, checked by every index's Apply).
const tierShift = 30

var _ = [1]struct{}{}[kvevent.MaxDPRank>>tierShift] // MaxDPRank < 2^tierShift

// tierHolder returns the holder of w's blocks in tier t.
func tierHolder(w kvevent.Worker, t kvevent.Tier) kvevent.Worker {
	w.DPRank |= kvevent.DPRank(t) << tierShift
	return w
}

// tierHolderOf returns the worker and tier a holder stands for.
func tierHolderOf(h kvevent.Worker) (kvevent.Worker, kvevent.Tier) {
	return kvevent.Worker{ID: h.ID, DPRank: h.DPRank & (1<<tierShift - 1)}, kvevent.Tier(h.DPRank >> tierShift)
}

// checkEvent refuses, for every index alike, an event whose rank or tier
// is out of range (kvevent.RouterEvent.Check): ranks at or past 2^30
// would name another tier's holder here.
func checkEvent(ev *kvevent.RouterEvent) error {
	if err := ev.Check(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	return nil
}

// holderIndex is an index made of per-worker holders, a holder for each
// (worker, tier) (see tierHolder): what applyToHolder changes in it.
type holderIndex interface {
	store(h kvevent.Worker, d kvevent.Stored) error
	remove(h kvevent.Worker, hashes []uint64) error
	clearHolder(h kvevent.Worker)
}

// applyToHolder checks ev and applies it to its worker's holder for its
// tier, setting tiered at the first event of a tier other than the
// device's.
func applyToHolder(t holderIndex, tiered *atomic.Bool, ev kvevent.RouterEvent) error {
	if err := checkEvent(&ev); err != nil {
		return err
	}
	w := ev.Worker()
	h := tierHolder(w, ev.Tier)
	if ev.Tier != kvevent.TierDevice && !tiered.Load() {
		tiered.Store(true)
	}
	switch d := ev.Event.Data.(type) {
	case kvevent.Stored:
		return t.store(h, d)
	case kvevent.Removed:
		return t.remove(h, d.BlockHashes)
	case kvevent.Cleared:
		t.clearHolder(h)
		return nil
	}
	return fmt.Errorf("%w: event %d of worker %v has no data", ErrInvalidEvent, ev.Event.ID, w)
}

// ranksOf returns the holders in workers of every rank and tier of id.
func ranksOf[H any](workers *xsync.Map[kvevent.Worker, H], id kvevent.WorkerID) []H {
	var ranks []H
	workers.Range(func(w kvevent.Worker, h H) bool {
		if w.ID == id {
			ranks = append(ranks, h)
		}
		return true
	})
	return ranks
}

// otherTiersOf returns the holders in workers of h's worker in the other
// tiers (none while tiered is unset: every event has been the device's).
func otherTiersOf[H any](workers *xsync.Map[kvevent.Worker, H], tiered *atomic.Bool, h kvevent.Worker) (out [kvevent.NumTiers - 1]H) {
	if !tiered.Load() {
		return out
	}
	w, tier := tierHolderOf(h)
	i := 0
	for _, o := range kvevent.Tiers {
		if o != tier {
			out[i], _ = workers.Load(tierHolder(w, o))
			i++
		}
	}
	return out
}

// groups is a table of shared-tier holders (TierIndex.SetGroup). It is
// immutable once built: with returns a new one, so that readers may hold
// one while a writer replaces it. The nil table is empty.
type groups struct {
	members  map[kvevent.Worker][]kvevent.Worker // holder -> members
	memberOf map[kvevent.Worker][]kvevent.Worker // member -> holders
}

// with returns the table with holder serving members (none: undeclared).
func (g *groups) with(holder kvevent.Worker, members []kvevent.Worker) *groups {
	out := &groups{members: map[kvevent.Worker][]kvevent.Worker{}, memberOf: map[kvevent.Worker][]kvevent.Worker{}}
	if g != nil {
		maps.Copy(out.members, g.members)
	}
	delete(out.members, holder)
	if len(members) > 0 {
		out.members[holder] = slices.Clone(members)
	}
	for h, ms := range out.members {
		for _, m := range ms {
			out.memberOf[m] = append(out.memberOf[m], h)
		}
	}
	return out
}

// isHolder reports whether w is a declared holder.
func (g *groups) isHolder(w kvevent.Worker) bool {
	if g == nil {
		return false
	}
	_, ok := g.members[w]
	return ok
}

// membersOf returns holder's members.
func (g *groups) membersOf(holder kvevent.Worker) []kvevent.Worker {
	if g == nil {
		return nil
	}
	return g.members[holder]
}

// holdersOf returns the holders serving w.
func (g *groups) holdersOf(w kvevent.Worker) []kvevent.Worker {
	if g == nil {
		return nil
	}
	return g.memberOf[w]
}

// tierWalk accumulates cumulative tier scores along a request's path: at
// each block, the tiers each worker holds it in (its groups' included);
// shared by the indexes that keep tiers.
type tierWalk struct {
	res   TierScores
	near  map[kvevent.Worker]int // the nearest tier whose prefix still grows
	alive []kvevent.Worker
	depth int
}

func newTierWalk() *tierWalk {
	return &tierWalk{res: TierScores{Scores: map[kvevent.Worker][kvevent.NumTiers]uint32{}, TreeSizes: map[kvevent.Worker]int{}},
		near: map[kvevent.Worker]int{}}
}

// start adds w, unless it is a group holder or known, at block 0.
func (tw *tierWalk) start(w kvevent.Worker, g *groups) {
	if g.isHolder(w) {
		return
	}
	if _, seen := tw.near[w]; !seen {
		tw.near[w] = 0
		tw.alive = append(tw.alive, w)
		tw.res.Scores[w] = [kvevent.NumTiers]uint32{}
	}
}

// block records block i, tiersOf giving each worker's tiers there; it
// reports whether any worker's prefix still grows.
func (tw *tierWalk) block(i int, tiersOf func(kvevent.Worker) kvevent.TierSet) bool {
	keep := tw.alive[:0]
	for _, w := range tw.alive {
		if near := nearestTier(tiersOf(w)); near > tw.near[w] {
			sc := tw.res.Scores[w]
			for l := tw.near[w]; l < near; l++ {
				sc[l] = uint32(i)
			}
			tw.res.Scores[w], tw.near[w] = sc, near
		}
		if tw.near[w] < kvevent.NumTiers {
			keep = append(keep, w)
		}
	}
	tw.alive = keep
	if len(keep) > 0 {
		tw.depth = i + 1
	}
	return len(keep) > 0
}

// run records m blocks from block depth at once: covered(w, t) gives how
// many of them, from the first, w holds in tier t or a nearer one (a run
// of the compressed tree). It reports whether any prefix still grows.
func (tw *tierWalk) run(depth, m int, covered func(w kvevent.Worker, tier int) uint32) bool {
	keep := tw.alive[:0]
	for _, w := range tw.alive {
		sc := tw.res.Scores[w]
		l := tw.near[w]
		for ; l < kvevent.NumTiers; l++ {
			c := int(covered(w, l))
			if c == m {
				break // this tier and the farther ones hold the whole run
			}
			sc[l] = uint32(depth + c)
		}
		tw.res.Scores[w], tw.near[w] = sc, l
		if l < kvevent.NumTiers {
			keep = append(keep, w)
		}
	}
	tw.alive = keep
	if len(keep) > 0 {
		tw.depth = depth + m
	}
	return len(keep) > 0
}

// finish scores the workers still growing at the walk's end.
func (tw *tierWalk) finish() TierScores {
	for _, w := range tw.alive {
		sc := tw.res.Scores[w]
		for l := tw.near[w]; l < kvevent.NumTiers; l++ {
			sc[l] = uint32(tw.depth)
		}
		tw.res.Scores[w] = sc
	}
	return tw.res
}

// nearestTier returns the nearest tier in s, or NumTiers if s is empty.
func nearestTier(s kvevent.TierSet) int {
	for l, tier := range kvevent.Tiers {
		if s.Has(tier) {
			return l
		}
	}
	return kvevent.NumTiers
}
