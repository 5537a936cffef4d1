package radix

import "math/bits"

// engineTable maps a worker's engine block hashes to where the block lives
// in a CompressedTree (a packed run id and offset, never 0). It is an
// open-addressing table of 16-byte entries with linear probing and
// backward-shift deletion (no tombstones), sized to a power of two: a probe
// is one cache line where a Go map touches a bucket header, a tophash array
// and the slot. The zero value is an empty table. Not safe for concurrent
// use.
type engineTable struct {
	e     []engineEntry // nil or a power of two long
	n     int
	shift uint8 // 64 - log2(len(e))
}

// engineEntry is one slot; loc == 0 marks it empty.
type engineEntry struct{ hash, loc uint64 }

// Load bounds: grow past 13/16 full (probe chains stay short with
// well-spread keys), shrink below 1/8 so a worker that evicts most of its
// blocks gives the memory back.
const (
	engineMinLen  = 8
	engineGrowNum = 13
	engineGrowDen = 16
)

func (t *engineTable) home(h uint64) int {
	// Fibonacci hashing: engine hashes in tests are small integers.
	return int((h * 0x9E3779B97F4A7C15) >> t.shift)
}

// get returns the location of engine hash h.
func (t *engineTable) get(h uint64) (uint64, bool) {
	if t.n == 0 {
		return 0, false
	}
	mask := len(t.e) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		e := &t.e[i]
		if e.loc == 0 {
			return 0, false
		}
		if e.hash == h {
			return e.loc, true
		}
	}
}

// slot returns the entry of h, inserting an empty one (loc 0) if absent;
// the caller must set its loc, or delete h again.
func (t *engineTable) slot(h uint64) (e *engineEntry, existed bool) {
	if (t.n+1)*engineGrowDen > len(t.e)*engineGrowNum {
		t.resize(max(engineMinLen, 2*len(t.e)))
	}
	mask := len(t.e) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		e := &t.e[i]
		if e.loc == 0 {
			// Taken from now on; the caller sets the real location.
			e.hash, e.loc = h, placeholderLoc
			t.n++
			return e, false
		}
		if e.hash == h {
			return e, true
		}
	}
}

// placeholderLoc marks an entry inserted by slot and not yet given a
// location; run ids start at 1, so every real location is at least 1<<32.
const placeholderLoc = 1

// del removes h and returns its location.
func (t *engineTable) del(h uint64) (uint64, bool) {
	if t.n == 0 {
		return 0, false
	}
	mask := len(t.e) - 1
	i := t.home(h)
	for ; ; i = (i + 1) & mask {
		if t.e[i].loc == 0 {
			return 0, false
		}
		if t.e[i].hash == h {
			break
		}
	}
	loc := t.e[i].loc
	// Backward shift: move later entries of the probe chain into the hole
	// unless that would put them before their home slot.
	for j := (i + 1) & mask; t.e[j].loc != 0; j = (j + 1) & mask {
		if home := t.home(t.e[j].hash); (j-home)&mask >= (j-i)&mask {
			t.e[i] = t.e[j]
			i = j
		}
	}
	t.e[i] = engineEntry{}
	t.n--
	if t.n == 0 {
		*t = engineTable{}
	} else if len(t.e) > engineMinLen && t.n*8 < len(t.e) {
		t.resize(len(t.e) / 2)
	}
	return loc, true
}

func (t *engineTable) resize(size int) {
	old := t.e
	t.e = make([]engineEntry, size)
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := size - 1
	for _, e := range old {
		if e.loc == 0 {
			continue
		}
		i := t.home(e.hash)
		for t.e[i].loc != 0 {
			i = (i + 1) & mask
		}
		t.e[i] = e
	}
}

// len returns the number of entries.
func (t *engineTable) len() int { return t.n }

// each calls fn for every entry. fn must not modify the table.
func (t *engineTable) each(fn func(h, loc uint64)) {
	for _, e := range t.e {
		if e.loc != 0 {
			fn(e.hash, e.loc)
		}
	}
}
