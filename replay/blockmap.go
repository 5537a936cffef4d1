package replay

// blockMap is an engine's prefix cache index: block hash -> registered
// block. Open addressing with linear probing and backward-shift deletion
// over a power of two at least twice the engine's blocks (an engine
// registers at most that many, so it does not grow in practice; it
// doubles past 3/4 full all the same): a probe is one cache line (hash and
// block side by side), where the Go map it replaces was 17% of a replay.
// Not safe for concurrent use.
type blockMap struct {
	slots []blockSlot
	mask  int
	shift uint // 64 - log2(len(slots))
	n     int
}

type blockSlot struct {
	hash uint64
	b    *cblock // nil: empty
}

// newBlockMap returns a map sized for n blocks.
func newBlockMap(n int) blockMap {
	size, shift := 8, uint(61)
	for size < 2*n {
		size, shift = size<<1, shift-1
	}
	return blockMap{slots: make([]blockSlot, size), mask: size - 1, shift: shift}
}

// home is the slot a hash starts at: the top bits of its Fibonacci mix.
func (m *blockMap) home(h uint64) int { return int(h * 0x9E3779B97F4A7C15 >> m.shift) }

// get returns the block of h, or nil.
func (m *blockMap) get(h uint64) *cblock {
	for i := m.home(h); ; i = (i + 1) & m.mask {
		s := &m.slots[i]
		if s.b == nil || s.hash == h {
			return s.b
		}
	}
}

// put registers b under its hash, which must be absent.
func (m *blockMap) put(b *cblock) {
	if 4*(m.n+1) > 3*len(m.slots) {
		old := m.slots
		*m = newBlockMap(len(old))
		for _, s := range old {
			if s.b != nil {
				m.put(s.b)
			}
		}
	}
	m.n++
	i := m.home(b.hash)
	for m.slots[i].b != nil {
		i = (i + 1) & m.mask
	}
	m.slots[i] = blockSlot{b.hash, b}
}

// del removes h, which must be present.
func (m *blockMap) del(h uint64) {
	i := m.home(h)
	for m.slots[i].hash != h || m.slots[i].b == nil {
		i = (i + 1) & m.mask
	}
	// Backward shift: pull later entries of the cluster into the hole
	// unless that would put them before their home.
	for j := (i + 1) & m.mask; m.slots[j].b != nil; j = (j + 1) & m.mask {
		if home := m.home(m.slots[j].hash); (j-home)&m.mask >= (j-i)&m.mask {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = blockSlot{}
	m.n--
}
