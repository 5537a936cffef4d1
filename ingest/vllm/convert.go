package vllm

import (
	"fmt"
	"sync/atomic"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
)

// MediumTier maps vLLM's medium to a storage tier as Dynamo does: GPU and
// DEVICE (and nil or unknown) are the device tier; CPU, CPU_PINNED and
// CPU_TIER1 host memory; CPU_TIER2, DISK, NVME and STORAGE disk; EXTERNAL,
// NETWORK, REMOTE and SHARED external.
func MediumTier(medium string) kvevent.Tier {
	switch medium {
	case "CPU", "CPU_PINNED", "CPU_TIER1":
		return kvevent.TierHostPinned
	case "CPU_TIER2", "DISK", "NVME", "STORAGE":
		return kvevent.TierDisk
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED":
		return kvevent.TierExternal
	}
	return kvevent.TierDevice
}

// ConvertStats counts what a converter turned into router events and what
// it refused, by reason.
type ConvertStats struct {
	Stored, Removed, Cleared uint64 // events converted
	BadBlockSize             uint64 // BlockStored of another block size (foreign or partial groups)
	BadTokenCount            uint64 // BlockStored whose tokens are not block_size per hash
	OtherGroup               uint64 // events of a KV cache group other than 0
	UnknownType              uint64 // event types this package does not know
	BadRank                  uint64 // batches with a negative rank
	// Undecodable counts events that did not decode, in batches whose
	// other events were applied (Event.Err).
	Undecodable uint64
	// Remote counts events of locality REMOTE (another engine's blocks,
	// vLLM 2026): dropped, as Dynamo does, failing closed.
	Remote uint64
	// Foreign counts RFC #1527 events naming another model or tenant than
	// the converter's engine (Converter.Model, Tenant): dropped.
	Foreign uint64
	// Multimodal counts stores cut at their first block with a multimodal
	// input or prompt embeddings (Event.MultimodalAt): the text blocks
	// before it are indexed, it and its descendants not (not counted in
	// Rejected, even where no block was before it).
	Multimodal uint64
	// Ownership counts events of an offload connector's ownership (vLLM
	// 2026, Event.Ownership): dropped, as SMG drops them.
	Ownership uint64
	// CopiesKept counts removed hashes not passed on because the engine
	// still holds another copy (see Converter); CopyCounts are the
	// (rank, tier, hash)s counted now.
	CopiesKept uint64
	CopyCounts int
}

// add adds o's counts to s.
func (s *ConvertStats) add(o ConvertStats) {
	s.Stored += o.Stored
	s.Removed += o.Removed
	s.Cleared += o.Cleared
	s.BadBlockSize += o.BadBlockSize
	s.BadTokenCount += o.BadTokenCount
	s.OtherGroup += o.OtherGroup
	s.UnknownType += o.UnknownType
	s.BadRank += o.BadRank
	s.Undecodable += o.Undecodable
	s.Remote += o.Remote
	s.Foreign += o.Foreign
	s.Multimodal += o.Multimodal
	s.Ownership += o.Ownership
	s.CopiesKept += o.CopiesKept
	s.CopyCounts += o.CopyCounts
}

// Rejected returns the events refused.
func (s ConvertStats) Rejected() uint64 {
	return s.BadBlockSize + s.BadTokenCount + s.OtherGroup + s.UnknownType + s.Undecodable + s.Remote + s.Foreign + s.Ownership
}

// Converter turns decoded batches of one worker into kvradix router events.
// Local (tokens) hashes come from package hashing over token_ids with the
// event's LoRA name, at the configured block size; engine hashes are kept as
// opaque keys. Every refused event is counted. Convert is not safe for
// concurrent use; Stats is.
//
// Copies. vLLM does not deduplicate its cache: one hash may be held in two
// physical blocks, each stored with a BlockStored and evicted with a
// BlockRemoved of its own (and offloading connectors store overlapping
// chunks). A consumer that drops the block at the first BlockRemoved loses
// a block the engine still holds. The converter counts the copies of each
// (rank, tier, hash) the engine stored, and passes a removal on only when
// the last copy goes, as Dynamo's EventDedupFilter does; a removal of a
// hash never counted passes (a resumed stream, a store lost). Where the
// engine says how many copies remain (remaining_copy_counts, vLLM #48933),
// its word is taken. A store of origin REUSED (vLLM #51699: a block the
// prefix cache reused, announced again under kv_cache_report_mode=full) is
// no new copy: it counts only a hash not counted yet. Without origin such
// announcements cannot be told from copies, and over-count: a block may
// then outlive its last eviction in the index. AllBlocksCleared, and
// Forget, drop a rank's counts.
type Converter struct {
	Worker    kvevent.WorkerID
	BlockSize int
	Rank      kvevent.DPRank // the rank of batches that name none
	// Model and Tenant are the engine's model and tenant, where known: an
	// event that names another (RFC #1527's model_name, tenant_id; a
	// tenant "default" is the unnamed tenant's) is counted as Foreign and
	// dropped. "" accepts any.
	Model, Tenant string
	next          uint64
	copies        map[copyPlace]map[uint64]uint32 // a hash's copies, by rank and tier
	counted       int                             // the hashes counted, every place
	c             struct {
		stored, removed, cleared, size, tokens, group, unknown, rank, undecodable, remote, foreign, multimodal, ownership, kept atomic.Uint64
		counted                                                                                                                 atomic.Int64
	}
}

// copyPlace is where an engine's copies of blocks are counted: a rank's
// tier.
type copyPlace struct {
	rank kvevent.DPRank
	tier kvevent.Tier
}

// NewConverter returns a converter for one worker.
func NewConverter(worker kvevent.WorkerID, blockSize int) *Converter {
	return &Converter{Worker: worker, BlockSize: blockSize}
}

// Stats returns the converter's counters.
func (c *Converter) Stats() ConvertStats {
	return ConvertStats{
		Stored: c.c.stored.Load(), Removed: c.c.removed.Load(), Cleared: c.c.cleared.Load(),
		BadBlockSize: c.c.size.Load(), BadTokenCount: c.c.tokens.Load(), OtherGroup: c.c.group.Load(),
		UnknownType: c.c.unknown.Load(), BadRank: c.c.rank.Load(), Undecodable: c.c.undecodable.Load(), Remote: c.c.remote.Load(),
		Foreign: c.c.foreign.Load(), Multimodal: c.c.multimodal.Load(), Ownership: c.c.ownership.Load(), CopiesKept: c.c.kept.Load(), CopyCounts: int(c.c.counted.Load()),
	}
}

// place returns the copy counts of a rank's tier, made on first use.
func (c *Converter) place(rank kvevent.DPRank, tier kvevent.Tier) map[uint64]uint32 {
	if c.copies == nil {
		c.copies = make(map[copyPlace]map[uint64]uint32)
	}
	m := c.copies[copyPlace{rank, tier}]
	if m == nil {
		m = make(map[uint64]uint32)
		c.copies[copyPlace{rank, tier}] = m
	}
	return m
}

// stored counts one more copy of each block.
func (c *Converter) stored(rank kvevent.DPRank, tier kvevent.Tier, hashes []uint64, reused bool) {
	m := c.place(rank, tier)
	for _, h := range hashes {
		if reused && m[h] > 0 {
			continue // announced again, not copied
		}
		if m[h]++; m[h] == 1 {
			c.counted++
		}
	}
	c.c.counted.Store(int64(c.counted))
}

// removed returns the hashes whose last copy went (in place: hashes is the
// decoded event's own), counting one copy less of each.
func (c *Converter) removed(rank kvevent.DPRank, tier kvevent.Tier, hashes []uint64, remaining []uint32) []uint64 {
	if len(remaining) != len(hashes) {
		remaining = nil // not the engine's word on these hashes
	}
	m := c.place(rank, tier)
	gone := hashes[:0]
	for i, h := range hashes {
		had := m[h]
		left := had
		switch {
		case remaining != nil:
			left = remaining[i]
		case left > 0:
			left--
		}
		switch {
		case left > 0:
			if had == 0 {
				c.counted++
			}
			m[h] = left
			c.c.kept.Add(1)
			continue
		case had > 0:
			delete(m, h)
			c.counted--
		}
		gone = append(gone, h)
	}
	c.c.counted.Store(int64(c.counted))
	return gone
}

// Forget drops the copy counts of a rank (every tier): its cache was
// cleared (an engine restarted, a resumed stream cleared).
func (c *Converter) Forget(rank kvevent.DPRank) { c.forget(rank, nil) }

// forget drops the counts of a rank, of one tier or (nil) all.
func (c *Converter) forget(rank kvevent.DPRank, tier *kvevent.Tier) {
	for p, m := range c.copies {
		if p.rank == rank && (tier == nil || p.tier == *tier) {
			c.counted -= len(m)
			delete(c.copies, p)
		}
	}
	c.c.counted.Store(int64(c.counted))
}

// Convert appends the router events of b to dst. The batch's data-parallel
// rank (c.Rank if it names none) becomes each event's rank;
// AllBlocksCleared becomes Cleared.
func (c *Converter) Convert(dst []kvevent.RouterEvent, b *Batch) []kvevent.RouterEvent {
	rank := c.Rank
	if b.DPRank != nil {
		if *b.DPRank < 0 {
			c.c.rank.Add(1)
			return dst
		}
		rank = kvevent.DPRank(*b.DPRank)
	}
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Err != nil {
			c.c.undecodable.Add(1)
			continue
		}
		if ev.Locality == "REMOTE" {
			c.c.remote.Add(1)
			continue
		}
		if c.foreign(ev) {
			c.c.foreign.Add(1)
			continue
		}
		if ev.Ownership != "" {
			c.c.ownership.Add(1)
			continue
		}
		out := kvevent.RouterEvent{WorkerID: c.Worker, Tier: MediumTier(ev.Medium), Event: kvevent.Event{DPRank: rank}}
		switch ev.Type {
		case BlockStored:
			if ev.GroupIdx != 0 {
				c.c.group.Add(1)
				continue
			}
			if ev.BlockSize != c.BlockSize && ev.BlockSize != 0 { // 0: not stated (RFC #1527's nil)
				c.c.size.Add(1)
				continue
			}
			if len(ev.TokenIDs) != c.BlockSize*len(ev.BlockHashes) {
				c.c.tokens.Add(1)
				continue
			}
			hashes, tokens := ev.BlockHashes, ev.TokenIDs
			if ev.MultimodalAt > 0 {
				c.c.multimodal.Add(1)
				keep := min(ev.MultimodalAt-1, len(hashes))
				if keep == 0 {
					continue
				}
				hashes, tokens = hashes[:keep], tokens[:keep*c.BlockSize]
			}
			local := hashing.LocalHashes(make([]uint64, 0, len(hashes)), tokens, c.BlockSize, hashing.Options{LoRAName: ev.LoRAName, Salt: ev.CacheSalt})
			st := kvevent.Stored{Blocks: make([]kvevent.StoredBlock, len(local))}
			for j, h := range local {
				st.Blocks[j] = kvevent.StoredBlock{BlockHash: hashes[j], TokensHash: h}
			}
			if ev.ParentBlockHash != nil {
				st.HasParent, st.ParentHash = true, *ev.ParentBlockHash
			}
			out.Event.Data = st
			c.c.stored.Add(1)
			c.stored(rank, out.Tier, hashes, ev.Origin == "REUSED")
		case BlockRemoved:
			if ev.GroupIdx != 0 {
				c.c.group.Add(1)
				continue
			}
			c.c.removed.Add(1)
			gone := c.removed(rank, out.Tier, ev.BlockHashes, ev.RemainingCopies)
			if len(gone) == 0 {
				continue // every hash has a copy left
			}
			out.Event.Data = kvevent.Removed{BlockHashes: gone}
		case AllBlocksCleared:
			out.Event.Data = kvevent.Cleared{}
			c.c.cleared.Add(1)
			c.forget(rank, &out.Tier)
		default:
			c.c.unknown.Add(1)
			continue
		}
		c.next++
		out.Event.ID = c.next
		dst = append(dst, out)
	}
	return dst
}

// String summarises the stats on one line.
func (s ConvertStats) String() string {
	return fmt.Sprintf("stored %d removed %d cleared %d; copies kept %d, counted %d; refused: block size %d, token count %d, other group %d, unknown type %d, bad rank %d, undecodable %d, remote %d, foreign %d, ownership %d; multimodal cut %d",
		s.Stored, s.Removed, s.Cleared, s.CopiesKept, s.CopyCounts, s.BadBlockSize, s.BadTokenCount, s.OtherGroup, s.UnknownType, s.BadRank, s.Undecodable, s.Remote, s.Foreign, s.Ownership, s.Multimodal)
}

// foreign reports whether ev names another model or tenant than c's
// engine.
func (c *Converter) foreign(ev *Event) bool {
	return ev.ModelName != "" && c.Model != "" && ev.ModelName != c.Model ||
		ev.TenantID != "" && unnamed(ev.TenantID) != unnamed(c.Tenant)
}

// unnamed returns tenant, with "default" (Mooncake's and the service's
// name of the unnamed tenant) as "".
func unnamed(tenant string) string {
	if tenant == "default" {
		return ""
	}
	return tenant
}
