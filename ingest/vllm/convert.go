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
}

// Rejected returns the events refused.
func (s ConvertStats) Rejected() uint64 {
	return s.BadBlockSize + s.BadTokenCount + s.OtherGroup + s.UnknownType + s.Undecodable + s.Remote
}

// Converter turns decoded batches of one worker into kvradix router events.
// Local (tokens) hashes come from package hashing over token_ids with the
// event's LoRA name, at the configured block size; engine hashes are kept as
// opaque keys. Every refused event is counted. Convert is not safe for
// concurrent use; Stats is.
type Converter struct {
	Worker    kvevent.WorkerID
	BlockSize int
	Rank      kvevent.DPRank // the rank of batches that name none
	next      uint64
	c         struct {
		stored, removed, cleared, size, tokens, group, unknown, rank, undecodable, remote atomic.Uint64
	}
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
	}
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
		out := kvevent.RouterEvent{WorkerID: c.Worker, Tier: MediumTier(ev.Medium), Event: kvevent.Event{DPRank: rank}}
		switch ev.Type {
		case BlockStored:
			if ev.GroupIdx != 0 {
				c.c.group.Add(1)
				continue
			}
			if ev.BlockSize != c.BlockSize {
				c.c.size.Add(1)
				continue
			}
			if len(ev.TokenIDs) != c.BlockSize*len(ev.BlockHashes) {
				c.c.tokens.Add(1)
				continue
			}
			local := hashing.LocalHashes(make([]uint64, 0, len(ev.BlockHashes)), ev.TokenIDs, c.BlockSize, hashing.Options{LoRAName: ev.LoRAName, Salt: ev.CacheSalt})
			st := kvevent.Stored{Blocks: make([]kvevent.StoredBlock, len(local))}
			for j, h := range local {
				st.Blocks[j] = kvevent.StoredBlock{BlockHash: ev.BlockHashes[j], TokensHash: h}
			}
			if ev.ParentBlockHash != nil {
				st.HasParent, st.ParentHash = true, *ev.ParentBlockHash
			}
			out.Event.Data = st
			c.c.stored.Add(1)
		case BlockRemoved:
			if ev.GroupIdx != 0 {
				c.c.group.Add(1)
				continue
			}
			out.Event.Data = kvevent.Removed{BlockHashes: ev.BlockHashes}
			c.c.removed.Add(1)
		case AllBlocksCleared:
			out.Event.Data = kvevent.Cleared{}
			c.c.cleared.Add(1)
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
	return fmt.Sprintf("stored %d removed %d cleared %d; refused: block size %d, token count %d, other group %d, unknown type %d, bad rank %d, undecodable %d, remote %d",
		s.Stored, s.Removed, s.Cleared, s.BadBlockSize, s.BadTokenCount, s.OtherGroup, s.UnknownType, s.BadRank, s.Undecodable, s.Remote)
}
