package replay

import (
	"slices"

	"github.com/kvradix/kvradix/kvevent"
)

// The host tier: an engine with EngineConfig.HostBlocks offloads the
// blocks its device pool evicts to a host LRU of that many blocks, as
// vLLM's CPU offloading does, publishing what a real offloading engine
// would: each block Stored in the host tier (under its parent, which the
// engine must still hold on the device or the host: a block whose parent
// is gone is not offloaded), then the device's Removed, then the host's
// Removed of what the host LRU evicts. A request whose prompt continues,
// past its device prefix, with blocks on the host loads them back instead
// of computing them: they cost HostLoadMs per token in its first step.

// HostLoadMs is the modelled time to load a token's KV back from host
// memory: a third of prefill's linear term, for a transfer several times
// cheaper than computing it (PCIe at ~25 GB/s against ~130 KB a token).
const HostLoadMs = 1.518344e-2 / 3

// hblock is a block on the host tier.
type hblock struct {
	hash, parent, local uint64
	hasParent           bool
	prev, next          *hblock // LRU links; lru.next is the oldest
}

// hostTier is an engine's host LRU.
type hostTier struct {
	cap     int
	blocks  map[uint64]*hblock
	lru     hblock // sentinel
	stored  []kvevent.Stored
	removed []uint64
}

// newHostTier returns a host tier of blocks blocks. Its map grows as the
// tier fills, from room for a few thousand: a tier of 1,024 times an
// engine's pool (Config.Offload's bound) is made in no time and memory.
func newHostTier(blocks int) *hostTier {
	h := &hostTier{cap: blocks, blocks: make(map[uint64]*hblock, min(blocks, 1<<12))}
	h.lru.prev, h.lru.next = &h.lru, &h.lru
	return h
}

func (h *hostTier) has(hash uint64) bool { return h.blocks[hash] != nil }

func (h *hostTier) unlink(b *hblock) {
	b.prev.next, b.next.prev = b.next, b.prev
}

func (h *hostTier) pushNewest(b *hblock) {
	b.prev, b.next = h.lru.prev, &h.lru
	h.lru.prev.next = b
	h.lru.prev = b
}

// touch makes hash the most recently used, if held.
func (h *hostTier) touch(hash uint64) {
	if b := h.blocks[hash]; b != nil {
		h.unlink(b)
		h.pushNewest(b)
	}
}

// offload takes a block the device evicts, queueing its Stored event, and
// evicts the host's oldest past capacity, queueing their removal.
func (h *hostTier) offload(b *cblock) {
	if h.blocks[b.hash] != nil {
		h.touch(b.hash)
		return
	}
	hb := &hblock{hash: b.hash, parent: b.parent, local: b.local, hasParent: b.hasParent}
	h.blocks[b.hash] = hb
	h.pushNewest(hb)
	// The host's removals are published after its stores: a block the host
	// evicted earlier in this batch and takes back now is simply kept
	// (storing it would come before, and be undone by, its removal).
	if i := slices.Index(h.removed, b.hash); i >= 0 {
		h.removed = slices.Delete(h.removed, i, i+1)
		return
	}
	h.stored = append(h.stored, kvevent.Stored{HasParent: b.hasParent, ParentHash: b.parent,
		Blocks: []kvevent.StoredBlock{{BlockHash: b.hash, TokensHash: b.local}}})
	for len(h.blocks) > h.cap {
		old := h.lru.next
		h.unlink(old)
		delete(h.blocks, old.hash)
		h.removed = append(h.removed, old.hash)
	}
}

// evictToHost offloads the blocks the device just evicted whose parent the
// engine still holds, and publishes the host's Stored events, the
// device's Removed, and the host's Removed, in that order: every parent is
// still held (on the device until its Removed, or on the host) when a
// child's host Stored applies.
func (e *engine) evictToHost(evicted []*cblock) {
	hashes := make([]uint64, len(evicted))
	gone := make(map[uint64]bool, len(evicted))
	for i, b := range evicted {
		hashes[i] = b.hash
		gone[b.hash] = true
	}
	for _, b := range evicted {
		if !b.hasParent || e.cache.get(b.parent) != nil || gone[b.parent] || e.host.has(b.parent) {
			e.host.offload(b)
		}
	}
	for _, st := range e.host.stored {
		e.publishTier(st, kvevent.TierHostPinned)
	}
	e.publish(kvevent.Removed{BlockHashes: hashes})
	if len(e.host.removed) > 0 {
		e.publishTier(kvevent.Removed{BlockHashes: e.host.removed}, kvevent.TierHostPinned)
	}
	e.host.stored, e.host.removed = e.host.stored[:0], nil
}

// hostPrefix is how many blocks past the device's cached prefix of r (hits
// blocks) the host holds in a row, within the prompt's cap.
func (e *engine) hostPrefix(r *request, hits int) int {
	if e.host == nil {
		return 0
	}
	n := hits
	limit := (r.isl - 1) / e.cfg.BlockSize
	for n < min(len(r.seq), limit) && e.cache.get(r.seq[n]) == nil && e.host.has(r.seq[n]) {
		n++
	}
	return n - hits
}
