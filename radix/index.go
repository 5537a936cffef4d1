// Package radix holds the prefix indexes of kvradix: which worker holds which
// KV cache blocks, and for a request's blocks, how many leading blocks each
// worker holds.
//
// Every index implements Index with the same semantics; Tree is the plainly
// written single-threaded reference; ConcurrentTree (one hash-table entry per
// block) and CompressedTree (one array per run of blocks) are safe for
// concurrent readers (ConcurrentIndex). Package radixtest holds the conformance suite
// both pass and the naive model they are checked against.
//
// # Semantics
//
// A node is a path of local (tokens) hashes from the root. Each worker
// (worker id and data-parallel rank) keeps a map from the engine's block
// hashes to the nodes they name; a worker holds a node exactly when at least
// one of its engine hashes names it. Several engine hashes may name one node
// (aliases): an engine that salts its hashes with something the router does
// not see (cache_salt, multimodal hashes) stores the same token path under
// another hash, and both stay usable, as in the reference.
//
//   - Stored: the parent is looked up in the worker's own map (no parent =
//     the root; any alias will do); an unknown parent rejects the whole event
//     (ErrParentNotFound), and so does a block whose engine hash equals its
//     parent's (ErrInvalidSequence: a chain cannot name itself as its
//     parent). Each block descends to the child keyed by its tokens hash and
//     its engine hash names that node from then on: if the worker already
//     held the node, the hash becomes another alias; if the hash named
//     another node, it stops naming that one (the worker leaves it unless
//     another alias still names it).
//   - Removed: each named hash stops naming its node; the worker leaves a
//     node when its last alias goes. Unknown hashes are skipped, the rest
//     applies, and the error wraps ErrBlockNotFound with the count.
//   - Cleared: the worker (this rank only) leaves every node it holds. A
//     rank's AllBlocksCleared speaks for that rank's engine; the worker's
//     other ranks keep their caches. (The reference's KvIndexer clears every
//     rank, its concurrent tree one; we follow the second: clearing ranks
//     that did not clear would forget blocks they still hold.) RemoveWorker
//     drops every rank.
//
// Removals do not cascade: a worker may hold a node without its parent, and
// its overlap score stops at the first block it does not hold. Nodes left
// with no workers and no children are unlinked. A worker's tree size counts
// the nodes it holds, not its engine hashes.
package radix

import (
	"errors"
	"fmt"

	"github.com/kvradix/kvradix/kvevent"
)

var (
	// ErrParentNotFound rejects a Stored event whose parent hash the worker
	// does not hold; nothing of the event is applied.
	ErrParentNotFound = errors.New("parent block not found")
	// ErrBlockNotFound reports Removed hashes the worker does not hold; the
	// rest of the event is applied.
	ErrBlockNotFound = errors.New("block not found")
	// ErrInvalidEvent rejects an event without data, or one whose rank or
	// tier is out of range (kvevent.RouterEvent.Check): every index
	// refuses the same events.
	ErrInvalidEvent = errors.New("invalid event")
	// ErrInvalidSequence rejects a Stored event in which a block's engine
	// hash equals its parent's; nothing of the event is applied.
	ErrInvalidSequence = errors.New("invalid block sequence")
)

// dropAlias consumes one of the aliases counted for node k beyond its
// first name, reporting false if k has none (the name going was its last).
func dropAlias[K comparable](aliases map[K]uint32, k K) bool {
	switch n := aliases[k]; n {
	case 0:
		return false
	case 1:
		delete(aliases, k)
	default:
		aliases[k] = n - 1
	}
	return true
}

// checkChain returns ErrInvalidSequence, naming the block, if a block of d
// names itself as its parent.
func checkChain(w kvevent.Worker, d kvevent.Stored) error {
	parent, has := d.ParentHash, d.HasParent
	for i, b := range d.Blocks {
		if has && b.BlockHash == parent {
			return fmt.Errorf("%w: worker %v, block %d (%#x) is its own parent", ErrInvalidSequence, w, i, b.BlockHash)
		}
		parent, has = b.BlockHash, true
	}
	return nil
}

// MissingBlocksError reports the hashes of a Removed event the worker did
// not hold; it matches ErrBlockNotFound under errors.Is.
type MissingBlocksError struct {
	Worker  kvevent.Worker
	Missing int // hashes not held
	Of      int // hashes in the event
}

func (e *MissingBlocksError) Error() string {
	return fmt.Sprintf("%v: %d of %d blocks of worker %v", ErrBlockNotFound, e.Missing, e.Of, e.Worker)
}

// Is makes errors.Is(err, ErrBlockNotFound) hold.
func (e *MissingBlocksError) Is(target error) bool { return target == ErrBlockNotFound }

// OverlapScores is the result of matching a request against an index.
type OverlapScores struct {
	// Scores maps each worker holding at least the first block to the number
	// of consecutive blocks from block 0 it holds.
	Scores map[kvevent.Worker]uint32
	// TreeSizes maps each scored worker to the number of blocks it holds in
	// the whole index, on the device (a measure of its cache pressure).
	TreeSizes map[kvevent.Worker]int
}

// TierScores is the result of matching a request against a TierIndex.
type TierScores struct {
	// Scores maps each worker holding the first block in some tier to,
	// per tier (indexed by kvevent.Tier), the number of consecutive blocks
	// from block 0 it holds in that tier or a nearer one: the device
	// prefix, the device-or-host prefix, and so on, each at least the one
	// before.
	Scores map[kvevent.Worker][kvevent.NumTiers]uint32
	// TreeSizes maps each scored worker to the blocks it holds, summed over
	// the tiers (a block in two tiers counts twice).
	TreeSizes map[kvevent.Worker]int
}

// TierIndex is an Index that keeps the tier of every (worker, block)
// membership: Stored adds the event's tier to its blocks (a block may be
// held in several), Removed and Cleared take away the event's tier only,
// and a parent is found whatever tier it is held in. FindMatches counts the
// device tier only (the seed's rule), its tree sizes the device's blocks;
// FindTierMatches reports every tier. Size counts (worker, block, tier)
// memberships. Dump yields a Stored per tier held. Every index of this
// package implements it.
//
// Shared tiers: SetGroup declares a holder (a node's host cache, a pool's
// remote store: a worker id of its own) as serving members; the blocks the
// holder's events store, once, count in FindTierMatches for every member
// at their tier, and the holder itself is not scored. Members who hold
// nothing themselves are scored for what their groups hold. SetGroup
// replaces a holder's members; none undeclares it.
type TierIndex interface {
	Index
	FindTierMatches(local []uint64) TierScores
	SetGroup(holder kvevent.Worker, members []kvevent.Worker)
}

var (
	_ TierIndex = (*Tree)(nil)
	_ TierIndex = (*ConcurrentTree)(nil)
	_ TierIndex = (*CompressedTree)(nil)
)

// Index is the contract every prefix index implements.
type Index interface {
	// Apply applies one event of the worker ev.Worker(). Tiers are not
	// looked at: filtering them is the indexer's job.
	Apply(ev kvevent.RouterEvent) error
	// FindMatches scores every worker against the request's local hashes.
	// With earlyExit the walk stops once a single worker still matches: its
	// score is then a lower bound of its true overlap.
	FindMatches(local []uint64, earlyExit bool) OverlapScores
	// RemoveWorker drops every rank of the worker and all it holds.
	RemoveWorker(id kvevent.WorkerID)
	// Size returns the number of (worker, block) pairs held (per tier, for
	// an index that keeps tiers).
	Size() int
	// Dump returns Device-tier events that rebuild an equal index when
	// applied in order to an empty one: Stored events, parents before
	// children, and for blocks a worker holds without their parent, a
	// placeholder Stored of the missing ancestors followed (at the end) by
	// its Removed.
	Dump() []kvevent.RouterEvent
}

// ConcurrentIndex is an Index that lets FindMatches, Size and its workers'
// tree sizes run from any number of goroutines while events are applied,
// provided the events of one worker id (and its RemoveWorker) come from one
// goroutine at a time. ConcurrentTree and CompressedTree implement it;
// shardpool.Pool drives either. Dump may run concurrently with writers
// only where the implementation says so: CompressedTree's waits for the
// writers in progress and holds new ones off; ConcurrentTree's must not.
// The interface is sealed (Tree has the same methods but not the
// contract): every implementation lives here and runs the concurrent
// stress test.
type ConcurrentIndex interface {
	Index
	// ApplyBatch applies evs in order, errs[i] receiving Apply's answer for
	// evs[i] (len(errs) >= len(evs)): a pool lane's batch, with whatever
	// the index takes per writer taken once.
	ApplyBatch(evs []kvevent.RouterEvent, errs []error)
	concurrent()
}

func (*ConcurrentTree) concurrent() {}
func (*CompressedTree) concurrent() {}

var (
	_ ConcurrentIndex = (*ConcurrentTree)(nil)
	_ ConcurrentIndex = (*CompressedTree)(nil)
)

// newScores returns empty result maps sized for n workers.
func newScores(n int) OverlapScores {
	return OverlapScores{
		Scores:    make(map[kvevent.Worker]uint32, n),
		TreeSizes: make(map[kvevent.Worker]int, n),
	}
}
