package radix

import (
	"fmt"
	"slices"

	"github.com/kvradix/kvradix/kvevent"
)

// Tree is the single-threaded reference index: a radix tree of blocks whose
// children are keyed by tokens hash, with a plain map of workers per node.
// It is written for clarity, not speed, and is the model every faster index
// is tested and measured against.
//
// A Tree is not safe for concurrent use.
type Tree struct {
	root    *node
	workers map[kvevent.Worker]*treeWorker
	size    int
	groups  *groups // shared tiers (SetGroup)
}

// treeWorker is what one worker holds.
type treeWorker struct {
	names map[uint64]name // engine hash -> the node it names, in which tiers
	nodes tierCount       // per tier, the nodes held in it
}

// name is what one engine hash of a worker names: a node, held in one or
// more tiers.
type name struct {
	n     *node
	tiers kvevent.TierSet
}

type node struct {
	key      uint64 // tokens hash of this block
	parent   *node
	children map[uint64]*node
	workers  map[kvevent.Worker]tierCount // per tier, the engine hashes of the worker naming this node
}

// tierCount counts, per tier, the engine hashes of a worker naming a node
// in that tier.
type tierCount [kvevent.NumTiers]int32

// sum returns the count over every tier.
func (c tierCount) sum() int {
	n := 0
	for _, x := range c {
		n += int(x)
	}
	return n
}

// set returns the tiers counted.
func (c tierCount) set() kvevent.TierSet {
	var s kvevent.TierSet
	for t, n := range c {
		if n > 0 {
			s |= kvevent.Tier(t).Set()
		}
	}
	return s
}

func newNode(key uint64, parent *node) *node {
	return &node{key: key, parent: parent, children: map[uint64]*node{}, workers: map[kvevent.Worker]tierCount{}}
}

// NewTree returns an empty tree. The zero Tree is empty and ready to use.
func NewTree() *Tree {
	t := &Tree{}
	t.ready()
	return t
}

// ready initialises a zero Tree.
func (t *Tree) ready() {
	if t.root == nil {
		t.root, t.workers = newNode(0, nil), map[kvevent.Worker]*treeWorker{}
	}
}

var _ Index = (*Tree)(nil)

// Apply implements Index.
func (t *Tree) Apply(ev kvevent.RouterEvent) error {
	t.ready()
	if err := checkEvent(&ev); err != nil {
		return err
	}
	w := ev.Worker()
	switch d := ev.Event.Data.(type) {
	case kvevent.Stored:
		return t.store(w, d, ev.Tier)
	case kvevent.Removed:
		return t.remove(w, d.BlockHashes, ev.Tier)
	case kvevent.Cleared:
		t.clear(w, ev.Tier)
		return nil
	}
	return fmt.Errorf("%w: event %d of worker %v has no data", ErrInvalidEvent, ev.Event.ID, w)
}

func (t *Tree) store(w kvevent.Worker, d kvevent.Stored, tier kvevent.Tier) error {
	if err := checkChain(w, d); err != nil {
		return err
	}
	tw := t.workers[w]
	parent := t.root
	if d.HasParent {
		var p name
		if tw != nil {
			p = tw.names[d.ParentHash]
		}
		if p.n == nil {
			return fmt.Errorf("%w: worker %v, parent %#x", ErrParentNotFound, w, d.ParentHash)
		}
		parent = p.n
	}
	if tw == nil {
		tw = &treeWorker{names: map[uint64]name{}}
		t.workers[w] = tw
	}
	for _, b := range d.Blocks {
		child := parent.children[b.TokensHash]
		if child == nil {
			child = newNode(b.TokensHash, parent)
			parent.children[b.TokensHash] = child
		}
		old, had := tw.names[b.BlockHash]
		switch {
		case had && old.n == child && old.tiers.Has(tier):
		case had && old.n == child: // held here already, now in this tier too
			tw.names[b.BlockHash] = name{child, old.tiers | tier.Set()}
			t.hold(child, w, tw, tier)
		default:
			// Name the new node first, so that leaving old cannot prune the
			// path just walked.
			tw.names[b.BlockHash] = name{child, tier.Set()}
			t.hold(child, w, tw, tier)
			if had {
				t.unname(old.n, w, tw, old.tiers)
			}
		}
		parent = child
	}
	return nil
}

// hold counts one more engine hash of w naming n in tier.
func (t *Tree) hold(n *node, w kvevent.Worker, tw *treeWorker, tier kvevent.Tier) {
	c := n.workers[w]
	if c[tier] == 0 {
		tw.nodes[tier]++
		t.size++
	}
	c[tier]++
	n.workers[w] = c
}

func (t *Tree) remove(w kvevent.Worker, hashes []uint64, tier kvevent.Tier) error {
	tw := t.workers[w]
	missing := 0
	for _, h := range hashes {
		var nm name
		if tw != nil {
			nm = tw.names[h]
		}
		if !nm.tiers.Has(tier) {
			missing++
			continue
		}
		t.drop(w, tw, h, nm, tier)
	}
	if missing > 0 {
		return &MissingBlocksError{Worker: w, Missing: missing, Of: len(hashes)}
	}
	return nil
}

// clear drops everything w holds in tier.
func (t *Tree) clear(w kvevent.Worker, tier kvevent.Tier) {
	tw := t.workers[w]
	if tw == nil {
		return
	}
	for h, nm := range tw.names {
		if nm.tiers.Has(tier) {
			t.drop(w, tw, h, nm, tier)
		}
	}
	if len(tw.names) == 0 {
		delete(t.workers, w)
	}
}

// drop takes tier away from engine hash h of w, which names nm.n in it.
func (t *Tree) drop(w kvevent.Worker, tw *treeWorker, h uint64, nm name, tier kvevent.Tier) {
	if rest := nm.tiers &^ tier.Set(); rest != 0 {
		tw.names[h] = name{nm.n, rest}
	} else {
		delete(tw.names, h)
	}
	t.unname(nm.n, w, tw, tier.Set())
}

// unname drops one engine hash of w naming n in tiers (the caller's map
// entry is the caller's to change); w leaves n with its last alias in its
// last tier, and the nodes left empty and childless are unlinked.
func (t *Tree) unname(n *node, w kvevent.Worker, tw *treeWorker, tiers kvevent.TierSet) {
	c := n.workers[w]
	for _, tier := range kvevent.Tiers {
		if tiers.Has(tier) {
			if c[tier]--; c[tier] == 0 {
				tw.nodes[tier]--
				t.size--
			}
		}
	}
	if c.set() != 0 {
		n.workers[w] = c
		return
	}
	delete(n.workers, w)
	for n != t.root && len(n.workers) == 0 && len(n.children) == 0 {
		delete(n.parent.children, n.key)
		n = n.parent
	}
}

// RemoveWorker implements Index.
func (t *Tree) RemoveWorker(id kvevent.WorkerID) {
	for w := range t.workers {
		if w.ID == id {
			for _, tier := range kvevent.Tiers {
				t.clear(w, tier)
			}
		}
	}
}

// Size implements Index.
func (t *Tree) Size() int { return t.size }

// FindMatches implements Index. It walks the request's path by tokens hash,
// keeping the workers that held every block so far; a worker is written to
// the result only when it drops out or the walk ends.
func (t *Tree) FindMatches(local []uint64, earlyExit bool) OverlapScores {
	t.ready()
	var res OverlapScores
	var active []kvevent.Worker
	depth := 0
	cur := t.root
	for i, h := range local {
		child := cur.children[h]
		if child == nil {
			break
		}
		if i == 0 {
			for w, c := range child.workers {
				if c[kvevent.TierDevice] > 0 {
					active = append(active, w)
				}
			}
			res = newScores(len(active))
		}
		keep := active[:0]
		for _, w := range active {
			if child.workers[w][kvevent.TierDevice] > 0 {
				keep = append(keep, w)
			} else {
				res.Scores[w] = uint32(i)
			}
		}
		active = keep
		if len(active) == 0 {
			break
		}
		cur, depth = child, i+1
		if earlyExit && len(active) == 1 {
			break
		}
	}
	if res.Scores == nil {
		res = newScores(0)
	}
	for _, w := range active {
		res.Scores[w] = uint32(depth)
	}
	for w := range res.Scores {
		res.TreeSizes[w] = int(t.workers[w].nodes[kvevent.TierDevice])
	}
	return res
}

// SetGroup implements TierIndex.
func (t *Tree) SetGroup(holder kvevent.Worker, members []kvevent.Worker) {
	t.groups = t.groups.with(holder, members)
}

// tiersAt returns the tiers in which w holds n, its groups' included.
func (t *Tree) tiersAt(n *node, w kvevent.Worker) kvevent.TierSet {
	s := n.workers[w].set()
	for _, g := range t.groups.holdersOf(w) {
		s |= n.workers[g].set()
	}
	return s
}

// FindTierMatches implements TierIndex: the walk of FindMatches, keeping
// per worker the nearest tier whose cumulative prefix is still growing.
// Group holders are not scored; their members are, with their holdings.
func (t *Tree) FindTierMatches(local []uint64) TierScores {
	t.ready()
	tw := newTierWalk()
	cur := t.root
	for i, h := range local {
		child := cur.children[h]
		if child == nil {
			break
		}
		if i == 0 {
			for w := range child.workers {
				tw.start(w, t.groups)
				for _, m := range t.groups.membersOf(w) {
					tw.start(m, t.groups)
				}
			}
		}
		if !tw.block(i, func(w kvevent.Worker) kvevent.TierSet { return t.tiersAt(child, w) }) {
			break
		}
		cur = child
	}
	res := tw.finish()
	for w := range res.Scores {
		if tw := t.workers[w]; tw != nil {
			res.TreeSizes[w] = tw.nodes.sum()
		}
	}
	return res
}

// Dump implements Index. It walks the tree breadth first, so parents come
// before children.
func (t *Tree) Dump() []kvevent.RouterEvent { return collect(t.dumpEach) }

// dumpEach yields what Dump returns (see DumpEach).
func (t *Tree) dumpEach(yield func(kvevent.RouterEvent)) {
	t.ready()
	d := &dumper[*node]{
		yield:  yield,
		root:   t.root,
		key:    func(n *node) uint64 { return n.key },
		parent: func(n *node) *node { return n.parent },
		owns: func(w kvevent.Worker, h uint64) bool {
			_, ok := t.workers[w].names[h]
			return ok
		},
		tiers: func(w kvevent.Worker, h uint64) kvevent.TierSet { return t.workers[w].names[h].tiers },
	}
	// Invert each worker's map: which engine hashes name a held node.
	for w, tw := range t.workers {
		for h, nm := range tw.names {
			d.addHeld(w, nm.n, h)
		}
	}
	queue := []*node{t.root}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n != t.root {
			ws := make([]kvevent.Worker, 0, len(n.workers))
			for w := range n.workers {
				ws = append(ws, w)
			}
			slices.SortFunc(ws, compareWorkers)
			for _, w := range ws {
				d.emit(w, n)
			}
		}
		keys := make([]uint64, 0, len(n.children))
		for k := range n.children {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			queue = append(queue, n.children[k])
		}
	}
	d.finish()
}
