package radixtest

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/zeebo/xxh3"

	"github.com/kvradix/kvradix/kvevent"
)

// Source is where the generator draws its choices from: a seeded PRNG for
// random tests, or fuzz input bytes.
type Source interface {
	// IntN returns a number in [0, n); n > 0.
	IntN(n int) int
}

// Bytes is a Source over fuzz input: each choice consumes one byte, and an
// exhausted input yields zeros.
type Bytes struct{ B []byte }

// IntN implements Source.
func (s *Bytes) IntN(n int) int {
	if len(s.B) == 0 {
		return 0
	}
	v := int(s.B[0])
	s.B = s.B[1:]
	return v % n
}

// Exhausted reports whether every byte was used.
func (s *Bytes) Exhausted() bool { return len(s.B) == 0 }

var _ Source = (*rand.Rand)(nil)

// OpKind is what an Op does.
type OpKind uint8

const (
	OpEvent OpKind = iota
	OpRemoveWorker
	OpQuery
)

// Op is one step of a generated command stream.
type Op struct {
	Kind   OpKind
	Event  kvevent.RouterEvent // OpEvent
	Worker kvevent.WorkerID    // OpRemoveWorker
	Query  []uint64            // OpQuery: local hashes
}

// Gen generates command streams over a small universe (3 worker ids, 2
// ranks, 3 tokens hashes) so that sharing, holes, duplicate and unknown
// hashes all happen often. It consults the model for realistic parents.
type Gen struct {
	Src   Source
	Model *Model
	// IDs are the worker ids drawn from (nil: 0, 1 and 2).
	IDs []kvevent.WorkerID
	// MaxBlocks bounds a Stored event's blocks (0: 4). Beyond 4, tokens
	// hashes mostly follow one path, so that long runs form, are shared by
	// workers, and are cut short by removals.
	MaxBlocks int
	// Tiers draws each event's tier (half of them the device), for
	// indexes that keep tiers (radix.TierIndex); without it every event is
	// the device's and the streams are those of before.
	Tiers bool
	// Restores makes a tenth of the stores store a path the worker holds
	// again, by the names it holds it by (a fresh hash where it holds
	// none), from the root or from a block of the path, and go on past it
	// by up to 2 new blocks: whole requests stored again and prefix-cache
	// hits announced again (vLLM's kv_cache_report_mode=full), which the
	// CompressedTree passes without locks.
	Restores bool
	// ChainHashes makes most new blocks' engine hashes a hash of their path,
	// as engines' chain hashes are: workers storing one path name its
	// blocks alike, and the CompressedTree's blocks are held by their own
	// hashes by every worker, not only the first.
	ChainHashes bool
	// Ever, if set, records every state of the model, each before the
	// index is given the event that leads to it (Step), for readers that
	// race the writer (RaceReader).
	Ever *EverHeld
	next uint64
	id   uint64
}

// Next returns the next op; events are applied to g.Model by the caller.
func (g *Gen) Next() Op {
	id := kvevent.WorkerID(0)
	if g.IDs == nil {
		id = kvevent.WorkerID(g.Src.IntN(3))
	} else {
		id = g.IDs[g.Src.IntN(len(g.IDs))]
	}
	w := kvevent.Worker{ID: id, DPRank: kvevent.DPRank(g.Src.IntN(2))}
	g.id++
	ev := kvevent.RouterEvent{WorkerID: w.ID, Event: kvevent.Event{ID: g.id, DPRank: w.DPRank}}
	if g.Tiers {
		ev.Tier = [...]kvevent.Tier{0, 0, 0, 0, 1, 1, 2, 3}[g.Src.IntN(8)]
	}
	switch c := g.Src.IntN(20); {
	case c < 9:
		ev.Event.Data = g.stored(w)
	case c < 14:
		ev.Event.Data = g.removed(w)
	case c < 15:
		ev.Event.Data = kvevent.Cleared{}
	case c < 16:
		return Op{Kind: OpRemoveWorker, Worker: w.ID}
	default:
		return Op{Kind: OpQuery, Query: g.query()}
	}
	return Op{Kind: OpEvent, Event: ev}
}

func (g *Gen) held(w kvevent.Worker) []uint64 { return g.Model.Hashes(w) }

// fresh returns a hash not drawn before.
func (g *Gen) fresh() uint64 {
	g.next++
	return 1000 + g.next
}

// engineHash picks a fresh hash mostly, else one w holds (duplicate or move)
// or a small constant (likely unknown, possibly shared by workers).
func (g *Gen) engineHash(w kvevent.Worker) uint64 {
	switch c := g.Src.IntN(10); {
	case c < 7:
		return g.fresh()
	case c < 9:
		if hs := g.held(w); len(hs) > 0 {
			return hs[g.Src.IntN(len(hs))]
		}
	}
	return uint64(g.Src.IntN(4))
}

func (g *Gen) stored(w kvevent.Worker) kvevent.Stored {
	if g.Restores && g.Src.IntN(10) == 0 {
		if s, ok := g.restored(w); ok {
			return s
		}
	}
	var s kvevent.Stored
	switch c := g.Src.IntN(10); {
	case c < 6:
		if hs := g.held(w); len(hs) > 0 {
			s.HasParent, s.ParentHash = true, hs[g.Src.IntN(len(hs))]
		}
	case c < 7:
		s.HasParent, s.ParentHash = true, uint64(g.Src.IntN(4)) // likely unknown
	}
	path := "" // the blocks' path, for ChainHashes
	if mw := g.Model.workers[w]; g.ChainHashes && s.HasParent && mw != nil {
		path = mw.byHash[s.ParentHash]
	}
	n := 1 + g.Src.IntN(max(g.MaxBlocks, 4))
	for range n {
		b := kvevent.StoredBlock{TokensHash: g.token()}
		if g.ChainHashes {
			path = extend(path, b.TokensHash)
		}
		if g.ChainHashes && g.Src.IntN(10) < 8 {
			b.BlockHash = xxh3.HashString(path) | 1<<63 // apart from the generator's other hashes (small numbers)
		} else {
			b.BlockHash = g.engineHash(w)
		}
		s.Blocks = append(s.Blocks, b)
	}
	return s
}

// restored stores again the path of a hash w holds (see Gen.Restores);
// false if w holds none.
func (g *Gen) restored(w kvevent.Worker) (kvevent.Stored, bool) {
	hs := g.held(w)
	if len(hs) == 0 {
		return kvevent.Stored{}, false
	}
	paths := g.Model.Paths(w)
	p := g.Model.workers[w].byHash[hs[g.Src.IntN(len(hs))]]
	var s kvevent.Stored
	from, blocks := 0, len(p)/8
	if blocks > 1 && g.Src.IntN(2) == 0 {
		cut := 1 + g.Src.IntN(blocks-1)
		if names := paths[p[:8*cut]]; len(names) > 0 {
			s.HasParent, s.ParentHash, from = true, names[g.Src.IntN(len(names))], cut
		}
	}
	for i := from; i < blocks; i++ {
		b := kvevent.StoredBlock{TokensHash: binary.LittleEndian.Uint64([]byte(p[8*i : 8*i+8]))}
		if names := paths[p[:8*i+8]]; len(names) > 0 {
			b.BlockHash = names[g.Src.IntN(len(names))]
		} else {
			b.BlockHash = g.fresh()
		}
		s.Blocks = append(s.Blocks, b)
	}
	for range g.Src.IntN(3) {
		s.Blocks = append(s.Blocks, kvevent.StoredBlock{BlockHash: g.fresh(), TokensHash: g.token()})
	}
	return s, true
}

// token draws a tokens hash: 1 to 3, or with MaxBlocks beyond 4, 1 nine
// times in ten.
func (g *Gen) token() uint64 {
	if g.MaxBlocks > 4 && g.Src.IntN(10) > 0 {
		return 1
	}
	return uint64(1 + g.Src.IntN(3))
}

func (g *Gen) removed(w kvevent.Worker) kvevent.Removed {
	var r kvevent.Removed
	if g.Src.IntN(3) == 0 {
		if r.BlockHashes = g.tail(w); len(r.BlockHashes) > 0 {
			return r
		}
	}
	hs := g.held(w)
	for range 1 + g.Src.IntN(3) {
		if len(hs) > 0 && g.Src.IntN(5) > 0 {
			r.BlockHashes = append(r.BlockHashes, hs[g.Src.IntN(len(hs))])
		} else {
			r.BlockHashes = append(r.BlockHashes, uint64(g.Src.IntN(4)))
		}
	}
	return r
}

// tail removes, as an engine evicts a sequence from its tail, a name of
// the path of a hash w holds, then a name of its parent path, and so on
// for up to 6 paths while w holds them.
func (g *Gen) tail(w kvevent.Worker) []uint64 {
	hs := g.held(w)
	if len(hs) == 0 {
		return nil
	}
	paths := g.Model.Paths(w)
	var out []uint64
	p := g.Model.workers[w].byHash[hs[g.Src.IntN(len(hs))]]
	for range 1 + g.Src.IntN(6) {
		names := paths[p]
		if len(names) == 0 {
			break
		}
		out = append(out, names[g.Src.IntN(len(names))])
		p = p[:len(p)-8]
	}
	return out
}

func (g *Gen) query() []uint64 {
	q := make([]uint64, g.Src.IntN(7))
	for i := range q {
		q[i] = uint64(1 + g.Src.IntN(3))
	}
	return q
}
