package shardpool

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvradix/kvradix/radix"
)

// Impl names an indexer the way the benchmarks, the load generator and the
// tests spell it: "single" (Single), "pool" (Pool over a ConcurrentTree)
// or "compressed" (Pool over a CompressedTree), with the pool's lanes.
type Impl struct {
	Name  string
	Lanes int // pools only
	// Blocks, if set, sizes a compressed pool's table of engine hashes up
	// front for this many blocks (radix.NewCompressedTreeSized; the
	// engines' pools summed, say); 0 grows it as it fills.
	Blocks int
}

// ImplNames lists every indexer implementation, baseline first.
var ImplNames = []string{"single", "pool", "compressed"}

// New starts the indexer for the block size. Impls come from ParseImpls,
// which rejects unknown names from outside; an Impl built by hand with a
// name not in ImplNames is a programming error, and New panics on it
// rather than start some other indexer.
func (i Impl) New(blockSize int) Indexer {
	switch i.Name {
	case "single":
		return NewSingle(blockSize)
	case "pool":
		return NewPoolOver(i.Lanes, blockSize, radix.NewConcurrentTree())
	case "compressed":
		return NewPoolOver(i.Lanes, blockSize, radix.NewCompressedTreeSized(i.Blocks))
	}
	panic(fmt.Sprintf("shardpool: unknown Impl %q (want one of %v)", i.Name, ImplNames))
}

// String is the benchmark-name form: impl=single, impl=pool/lanes=2,
// impl=compressed/lanes=2/sized for a table sized up front.
func (i Impl) String() string {
	if i.Name == "single" {
		return "impl=single"
	}
	if i.Blocks > 0 {
		return fmt.Sprintf("impl=%s/lanes=%d/sized", i.Name, i.Lanes)
	}
	return fmt.Sprintf("impl=%s/lanes=%d", i.Name, i.Lanes)
}

// ParseLanes reads a comma-separated list of lane counts (each 1 to
// MaxLanes).
func ParseLanes(lanes string) ([]int, error) {
	var ls []int
	for _, f := range strings.Split(lanes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > MaxLanes {
			return nil, fmt.Errorf("%q is not a lane count from 1 to %d", f, MaxLanes)
		}
		if slices.Contains(ls, n) {
			return nil, fmt.Errorf("%d lanes given twice", n)
		}
		ls = append(ls, n)
	}
	return ls, nil
}

// ParseImpls reads a comma-separated list of implementation names; each
// pool is taken at every lane count.
func ParseImpls(names string, lanes []int) ([]Impl, error) {
	var out []Impl
	var seen []string
	for _, name := range strings.Split(names, ",") {
		name = strings.TrimSpace(name)
		if slices.Contains(seen, name) {
			return nil, fmt.Errorf("index %q given twice", name)
		}
		seen = append(seen, name)
		switch name {
		case "single":
			out = append(out, Impl{Name: name, Lanes: 1})
		case "pool", "compressed":
			for _, n := range lanes {
				out = append(out, Impl{Name: name, Lanes: n})
			}
		default:
			return nil, fmt.Errorf("unknown index %q (want %s)", name, strings.Join(ImplNames, ", "))
		}
	}
	return out, nil
}
