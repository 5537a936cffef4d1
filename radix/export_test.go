package radix

import (
	"fmt"
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
