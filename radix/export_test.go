package radix

import (
	"slices"
	"unsafe"

	"fmt"
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
			for w := range c.workers {
				pairs++
				found := false
				for _, m := range t.workers[w] {
					found = found || m == c
				}
				if !found {
					return fmt.Errorf("worker %v in node %x without an engine hash", w, k)
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
	n := 0
	for w, lookup := range t.workers {
		for h, m := range lookup {
			if _, ok := m.workers[w]; !ok {
				return fmt.Errorf("worker %v hash %x names a node it is not in", w, h)
			}
		}
		n += len(lookup)
	}
	if n != pairs || n != t.size {
		return fmt.Errorf("%d hashes, %d memberships, size %d", n, pairs, t.size)
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
		for _, k := range cw.lookup {
			n, ok := t.nodes.Load(k)
			var buf [1]uint32
			if _, found := slices.BinarySearch(n.slots(&buf), cw.slot); !ok || !found {
				err = fmt.Errorf("worker %v names node %x it is not in", w, k)
				return false
			}
		}
		if int(cw.size.Load()) != len(cw.lookup) {
			err = fmt.Errorf("worker %v size %d, map %d", w, cw.size.Load(), len(cw.lookup))
		}
		pairs += len(cw.lookup)
		return err == nil
	})
	if err == nil && (pairs != members || pairs != t.Size()) {
		err = fmt.Errorf("%d hashes, %d memberships, size %d", pairs, members, t.Size())
	}
	return nodes, err
}

// CNodeSize is the size of a ConcurrentTree node, held by value in the
// map's entries.
const CNodeSize = unsafe.Sizeof(cnode{})
