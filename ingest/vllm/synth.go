package vllm

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/zeebo/xxh3"
)

// SynthEngine generates the event stream of a vLLM engine with prefix
// caching: BlockStored chains of new blocks (token ids included) under a
// block it holds or at the root, and BlockRemoved evictions of blocks it
// holds, one step per call. Block hashes are chained over the parent's hash
// and the block's tokens, as vLLM's are. It is for tests and load
// generation; it is not safe for concurrent use.
type SynthEngine struct {
	BlockSize   int
	BlocksPer   int     // blocks per BlockStored
	RemoveRatio float64 // share of steps that evict instead
	rng         *rand.Rand
	held        []uint64 // hashes held, in storage order
	pos         map[uint64]int
	next        uint32
}

// NewSynthEngine returns a seeded generator.
func NewSynthEngine(seed uint64, blockSize, blocksPer int, removeRatio float64) *SynthEngine {
	return &SynthEngine{BlockSize: blockSize, BlocksPer: blocksPer, RemoveRatio: removeRatio,
		rng: rand.New(rand.NewPCG(seed, 0x656e67696e65)), pos: map[uint64]int{}}
}

// Restart forgets every block, as a restarted engine does.
func (g *SynthEngine) Restart() {
	g.held = g.held[:0]
	clear(g.pos)
}

func (g *SynthEngine) hold(h uint64) {
	g.pos[h] = len(g.held)
	g.held = append(g.held, h)
}

func (g *SynthEngine) drop(h uint64) {
	i := g.pos[h]
	last := g.held[len(g.held)-1]
	g.held[i] = last
	g.pos[last] = i
	g.held = g.held[:len(g.held)-1]
	delete(g.pos, h)
}

// Step returns the next event.
func (g *SynthEngine) Step() Event {
	if len(g.held) > 0 && g.rng.Float64() < g.RemoveRatio {
		n := 1 + g.rng.IntN(min(8, len(g.held)))
		ev := Event{Type: BlockRemoved, Medium: "GPU"}
		for range n {
			h := g.held[g.rng.IntN(len(g.held))]
			g.drop(h)
			ev.BlockHashes = append(ev.BlockHashes, h)
		}
		return ev
	}
	ev := Event{Type: BlockStored, BlockSize: g.BlockSize, Medium: "GPU", KVCacheSpecKind: "full_attention"}
	var parent uint64
	if len(g.held) > 0 && g.rng.IntN(4) > 0 {
		parent = g.held[g.rng.IntN(len(g.held))]
		p := parent // parent moves down the chain below
		ev.ParentBlockHash = &p
	}
	var buf []byte
	for range g.BlocksPer {
		buf = binary.LittleEndian.AppendUint64(buf[:0], parent)
		for range g.BlockSize {
			g.next++
			t := g.next*2654435761 ^ uint32(g.rng.IntN(50000))
			ev.TokenIDs = append(ev.TokenIDs, t%150000)
			buf = binary.LittleEndian.AppendUint32(buf, t%150000)
		}
		h := xxh3.Hash(buf)
		if _, dup := g.pos[h]; dup {
			h ^= uint64(g.next) << 1
		}
		ev.BlockHashes = append(ev.BlockHashes, h)
		g.hold(h)
		parent = h
	}
	return ev
}
