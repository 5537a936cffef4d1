// Package kvevent defines the events an inference worker publishes about its
// KV cache and the router consumes: blocks stored, blocks removed, cache
// cleared. The types mirror NVIDIA Dynamo's kv-router protocol, and their JSON
// form is byte-compatible with Dynamo's serialisation of RouterEvent.
//
// An Event carries exactly one of three variants, Stored, Removed or Cleared,
// behind the sealed Data interface: no other type can be an event's data, so
// an event with two variants, or with a stored block list on a removal,
// cannot be built.
package kvevent

import (
	"fmt"
)

// WorkerID identifies an inference worker (Dynamo's worker id).
type WorkerID uint64

// DPRank is a data-parallel rank inside one worker.
type DPRank uint32

// MaxDPRank is the highest rank kvradix accepts, at every edge (event
// decoders, the service's registration) and in every index: the indexes
// keep tiers in a rank's top two bits. No engine runs anywhere near 2^30
// data-parallel ranks.
const MaxDPRank DPRank = 1<<30 - 1

// Worker is one owner of a KV cache: ranks of one worker id hold separate
// caches and are separate workers to the index.
type Worker struct {
	ID     WorkerID
	DPRank DPRank
}

// String returns "id" for rank 0 and "id/rank" otherwise.
func (w Worker) String() string {
	if w.DPRank == 0 {
		return fmt.Sprint(uint64(w.ID))
	}
	return fmt.Sprintf("%d/%d", w.ID, w.DPRank)
}

// Tier is where a worker holds a block. Only the Device tier (GPU memory)
// counts for prefix overlap; the others are reported by offloading engines.
type Tier uint8

const (
	// TierDevice is GPU memory: the default, and the only tier that counts
	// for primary overlap.
	TierDevice Tier = iota
	// TierHostPinned is pinned host (CPU) memory.
	TierHostPinned
	// TierDisk is local disk.
	TierDisk
	// TierExternal is remote or shared storage.
	TierExternal
)

// NumTiers is how many tiers there are.
const NumTiers = 4

var tierNames = [NumTiers]string{"device", "host_pinned", "disk", "external"}

// Tiers lists every tier, nearest (fastest) first.
var Tiers = [NumTiers]Tier{TierDevice, TierHostPinned, TierDisk, TierExternal}

// TierSet is a set of tiers, a bit each.
type TierSet uint8

// Set returns the set of t alone.
func (t Tier) Set() TierSet { return 1 << t }

// Has reports whether s holds t.
func (s TierSet) Has(t Tier) bool { return s&t.Set() != 0 }

// UpTo reports whether s holds a tier at t or nearer.
func (s TierSet) UpTo(t Tier) bool { return s&(TierSet(2)<<t-1) != 0 }

// String returns the tier's snake_case wire name, as Dynamo writes it.
func (t Tier) String() string {
	if int(t) < len(tierNames) {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// IsGPU reports whether t is the GPU tier, the only one that counts for
// primary overlap.
func (t Tier) IsGPU() bool { return t == TierDevice }

// ParseTier parses a snake_case tier name ("device", "host_pinned", "disk",
// "external").
func ParseTier(s string) (Tier, error) {
	for i, n := range tierNames {
		if n == s {
			return Tier(i), nil
		}
	}
	return 0, fmt.Errorf("unknown tier %q", s)
}

// StoredBlock is one block of a Stored event.
type StoredBlock struct {
	// BlockHash is the engine's own hash of the block: an opaque key the
	// engine later names in Removed events and as a parent.
	BlockHash uint64
	// TokensHash is the local hash of the block's tokens (package hashing):
	// the key the index matches requests by.
	TokensHash uint64
}

// Kind names an event variant.
type Kind uint8

const (
	KindStored Kind = iota + 1
	KindRemoved
	KindCleared
)

// String returns "stored", "removed" or "cleared", the variants' wire names.
func (k Kind) String() string {
	switch k {
	case KindStored:
		return "stored"
	case KindRemoved:
		return "removed"
	case KindCleared:
		return "cleared"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Data is an event's variant: Stored, Removed or Cleared, and nothing else.
type Data interface {
	Kind() Kind
	isData() // seals the interface: only this package's types are data
}

// Stored says the worker now holds Blocks, a chain in which each block
// extends the previous one, and the first extends the block with engine
// hash ParentHash (when HasParent) or starts at the root.
type Stored struct {
	HasParent  bool
	ParentHash uint64
	Blocks     []StoredBlock
}

// Removed says the worker evicted the blocks with these engine hashes.
type Removed struct {
	BlockHashes []uint64
}

// Cleared says the worker dropped its whole cache.
type Cleared struct{}

func (Stored) Kind() Kind  { return KindStored }
func (Removed) Kind() Kind { return KindRemoved }
func (Cleared) Kind() Kind { return KindCleared }

func (Stored) isData()  {}
func (Removed) isData() {}
func (Cleared) isData() {}

// Event is one KV cache event of a worker.
type Event struct {
	// ID is the event's number in the worker's sequence.
	ID uint64
	// DPRank is the data-parallel rank that published it.
	DPRank DPRank
	// Data is the variant; a nil Data is invalid and rejected by every
	// consumer.
	Data Data
}

// RouterEvent is an Event with the worker and storage tier it came from.
type RouterEvent struct {
	WorkerID WorkerID
	Tier     Tier
	Event    Event
}

// Check reports what makes e unfit for any index: a rank past MaxDPRank,
// or a tier past the last. Every index refuses such an event with it.
func (e *RouterEvent) Check() error {
	if e.Event.DPRank > MaxDPRank {
		return fmt.Errorf("worker %d: dp_rank %d past the highest, %d", e.WorkerID, e.Event.DPRank, MaxDPRank)
	}
	if e.Tier >= NumTiers {
		return fmt.Errorf("worker %v: tier %d past the last, %d", e.Worker(), e.Tier, NumTiers-1)
	}
	return nil
}

// Worker returns the cache owner the event applies to.
func (e *RouterEvent) Worker() Worker {
	return Worker{ID: e.WorkerID, DPRank: e.Event.DPRank}
}

// Blocks returns how many blocks the event names (stored or removed); a
// cleared event names none. The load generator counts block operations by it.
func (e *RouterEvent) Blocks() int {
	switch d := e.Event.Data.(type) {
	case Stored:
		return len(d.Blocks)
	case Removed:
		return len(d.BlockHashes)
	}
	return 0
}
