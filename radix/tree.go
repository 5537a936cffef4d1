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
}

// treeWorker is what one worker holds.
type treeWorker struct {
	names map[uint64]*node // engine hash -> node
	nodes int              // nodes held (each named by one or more hashes)
}

type node struct {
	key      uint64 // tokens hash of this block
	parent   *node
	children map[uint64]*node
	workers  map[kvevent.Worker]int // engine hashes of the worker naming this node
}

func newNode(key uint64, parent *node) *node {
	return &node{key: key, parent: parent, children: map[uint64]*node{}, workers: map[kvevent.Worker]int{}}
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
	w := ev.Worker()
	switch d := ev.Event.Data.(type) {
	case kvevent.Stored:
		return t.store(w, d)
	case kvevent.Removed:
		return t.remove(w, d.BlockHashes)
	case kvevent.Cleared:
		t.clear(w)
		return nil
	}
	return fmt.Errorf("%w: event %d of worker %v has no data", ErrInvalidEvent, ev.Event.ID, w)
}

func (t *Tree) store(w kvevent.Worker, d kvevent.Stored) error {
	if err := checkChain(w, d); err != nil {
		return err
	}
	tw := t.workers[w]
	parent := t.root
	if d.HasParent {
		var p *node
		if tw != nil {
			p = tw.names[d.ParentHash]
		}
		if p == nil {
			return fmt.Errorf("%w: worker %v, parent %#x", ErrParentNotFound, w, d.ParentHash)
		}
		parent = p
	}
	if tw == nil {
		tw = &treeWorker{names: map[uint64]*node{}}
		t.workers[w] = tw
	}
	for _, b := range d.Blocks {
		child := parent.children[b.TokensHash]
		if child == nil {
			child = newNode(b.TokensHash, parent)
			parent.children[b.TokensHash] = child
		}
		old, had := tw.names[b.BlockHash]
		if had && old == child {
			parent = child
			continue
		}
		// Name the new node first, so that leaving old cannot prune the
		// path just walked.
		tw.names[b.BlockHash] = child
		if child.workers[w]++; child.workers[w] == 1 {
			tw.nodes++
			t.size++
		}
		if had {
			t.unname(old, w, tw)
		}
		parent = child
	}
	return nil
}

func (t *Tree) remove(w kvevent.Worker, hashes []uint64) error {
	tw := t.workers[w]
	missing := 0
	for _, h := range hashes {
		var n *node
		if tw != nil {
			n = tw.names[h]
		}
		if n == nil {
			missing++
			continue
		}
		delete(tw.names, h)
		t.unname(n, w, tw)
	}
	if missing > 0 {
		return &MissingBlocksError{Worker: w, Missing: missing, Of: len(hashes)}
	}
	return nil
}

func (t *Tree) clear(w kvevent.Worker) {
	if tw := t.workers[w]; tw != nil {
		for _, n := range tw.names {
			t.unname(n, w, tw)
		}
	}
	delete(t.workers, w)
}

// unname drops one engine hash of w naming n (the caller's map entry is
// the caller's to delete); w leaves n with its last alias, and the nodes
// left empty and childless are unlinked.
func (t *Tree) unname(n *node, w kvevent.Worker, tw *treeWorker) {
	if n.workers[w]--; n.workers[w] > 0 {
		return
	}
	delete(n.workers, w)
	tw.nodes--
	t.size--
	for n != t.root && len(n.workers) == 0 && len(n.children) == 0 {
		delete(n.parent.children, n.key)
		n = n.parent
	}
}

// RemoveWorker implements Index.
func (t *Tree) RemoveWorker(id kvevent.WorkerID) {
	for w := range t.workers {
		if w.ID == id {
			t.clear(w)
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
			for w := range child.workers {
				active = append(active, w)
			}
			res = newScores(len(active))
		}
		keep := active[:0]
		for _, w := range active {
			if _, ok := child.workers[w]; ok {
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
		res.TreeSizes[w] = t.workers[w].nodes
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
	}
	// Invert each worker's map: which engine hashes name a held node.
	for w, tw := range t.workers {
		for h, n := range tw.names {
			d.addHeld(w, n, h)
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
