// Package openloop is the field's open-loop benchmark of KV indexes, as
// Dynamo's mooncake_bench and SMG's replay run it: a corpus of timed
// operations (lookups and KV events of many workers), issued by absolute
// deadline against an index.
//
//   - Build makes a corpus from a trace through the mock engines (package
//     replay); ReadFile and WriteFile carry it in SMG's SMGMCK01 format
//     (below), so that kvradix replays the corpora the field replays and
//     the field can replay kvradix's.
//   - Run issues a corpus against an indexer by the drain-correct protocol
//     and returns a Result, Dynamo's OpenLoopResult (schema 4) with
//     kvradix's keys: the CPU the index's lanes spent and the block
//     operations per second of it, the field's figure per lane core.
//   - Sweep finds in one process the shortest window an indexer keeps up
//     with; FindSustained runs the field's threshold protocol over fresh
//     processes that its caller starts.
//   - MeasureMemory is Dynamo's indexer_memory method: live bytes per
//     membership over the replay.
//   - CheckHoles checks lookups across workers' mid-chain evictions
//     against a naive model.
//
// # Format
//
// All integers little-endian, packed. A header:
//
//	0   magic "SMGMCK01"
//	8   u32 version (1)
//	12  u32 block_size
//	16  u64 reference_window_ns
//	24  u64 trace_duplication_factor
//	32  u64 trace_length_factor
//	40  u64 inference_worker_duplication_factor
//	48  u64 logical_workers (the highest worker id + 1)
//	56  7 × u64 totals: requests, stored_events, removed_events,
//	    cleared_events, request_blocks, stored_blocks, removed_blocks
//	112 the trace's path: u64 n, n bytes (informational)
//
// then three slabs, each a u64 count and its entries: the queries' local
// block hashes (u64 each), the stored blocks (u64 engine hash, u64 local
// hash), the removed engine hashes (u64 each); then the operations, a u64
// count and per operation u32 id, u64 deadline_ns, u64 worker_id, u8 kind
// and the kind's fields:
//
//	0 query    u64 start, u32 len (into the query slab)
//	1 stored   u32 dp_rank, u64 event_id, u8 has_parent, u64 parent,
//	           u8 has_start_position, u32 start_position, u64 start, u32 len
//	2 removed  u32 dp_rank, u64 event_id, u64 start, u32 len
//	3 cleared  u32 dp_rank, u64 event_id
//
// Operations come in issue order: by deadline, queries before events at
// one deadline, then by worker id, then in trace order; an operation's id
// is its position. A reader checks the order, the ids, the slabs' bounds
// and the totals, and names the offset of what it refuses.
package openloop

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/kvradix/kvradix/kvevent"
)

// Magic opens every corpus; Version is the one this package reads and
// writes.
const (
	Magic   = "SMGMCK01"
	Version = 1
)

// Header is a corpus's description: how it was made.
type Header struct {
	BlockSize uint32
	// ReferenceWindow is the span the deadlines are scaled to; a replay
	// rescales them linearly for its own window or offered rate.
	ReferenceWindow   time.Duration
	TraceDuplication  uint64
	TraceLength       uint64 // the trace's length factor
	WorkerDuplication uint64
	LogicalWorkers    uint64 // the highest worker id + 1
	TracePath         string // informational
}

// Totals are a corpus's counts; its block operations are the blocks of
// its queries, stores and removals.
type Totals struct {
	Requests, StoredEvents, RemovedEvents, ClearedEvents uint64
	RequestBlocks, StoredBlocks, RemovedBlocks           uint64
}

// BlockOps is RequestBlocks + StoredBlocks + RemovedBlocks.
func (t Totals) BlockOps() uint64 { return t.RequestBlocks + t.StoredBlocks + t.RemovedBlocks }

// LogicalOps is requests plus events.
func (t Totals) LogicalOps() uint64 {
	return t.Requests + t.StoredEvents + t.RemovedEvents + t.ClearedEvents
}

// Op is one timed operation: a lookup (Query set) or a KV event of Worker.
type Op struct {
	Deadline time.Duration // from the window's start
	Worker   kvevent.WorkerID
	Query    []uint64      // a lookup's local block hashes; nil for an event
	Event    kvevent.Event // Stored, Removed or Cleared, with its rank and id
	// StartPosition, for a store, is the position of its first block in
	// the sequence, where the corpus gives it.
	StartPosition *uint32
}

// IsQuery reports whether o is a lookup.
func (o *Op) IsQuery() bool { return o.Query != nil }

// class orders operations at one deadline: queries first.
func (o *Op) class() int {
	if o.IsQuery() {
		return 0
	}
	return 1
}

// Before reports whether a must be issued before b by the corpus's order
// (deadline, queries first, worker); operations equal by it keep their
// trace order.
func Before(a, b *Op) bool { return compareOps(a, b) < 0 }

func compareOps(a, b *Op) int {
	return cmp.Or(cmp.Compare(a.Deadline, b.Deadline), cmp.Compare(a.class(), b.class()), cmp.Compare(a.Worker, b.Worker))
}

// Corpus is a header and its operations, in issue order.
type Corpus struct {
	Header
	Ops []Op
}

// Totals counts the corpus's operations and blocks.
func (c *Corpus) Totals() Totals {
	var t Totals
	for i := range c.Ops {
		t.Add(&c.Ops[i])
	}
	return t
}

// Add counts one operation.
func (t *Totals) Add(o *Op) {
	if o.IsQuery() {
		t.Requests++
		t.RequestBlocks += uint64(len(o.Query))
		return
	}
	switch d := o.Event.Data.(type) {
	case kvevent.Stored:
		t.StoredEvents++
		t.StoredBlocks += uint64(len(d.Blocks))
	case kvevent.Removed:
		t.RemovedEvents++
		t.RemovedBlocks += uint64(len(d.BlockHashes))
	case kvevent.Cleared:
		t.ClearedEvents++
	}
}

// Check reports the first operation out of order or of no kind.
func (c *Corpus) Check() error {
	for i := range c.Ops {
		o := &c.Ops[i]
		if !o.IsQuery() {
			switch o.Event.Data.(type) {
			case kvevent.Stored, kvevent.Removed, kvevent.Cleared:
			default:
				return fmt.Errorf("openloop: operation %d: neither a query nor an event", i)
			}
		}
		if i > 0 && compareOps(&c.Ops[i-1], o) > 0 {
			return fmt.Errorf("openloop: operation %d comes before operation %d in issue order", i, i-1)
		}
		if o.Deadline < 0 {
			return fmt.Errorf("openloop: operation %d: negative deadline", i)
		}
	}
	return nil
}

const (
	kindQuery uint8 = iota
	kindStored
	kindRemoved
	kindCleared
)

// WriteTo writes the corpus in SMGMCK01 (after Check).
func (c *Corpus) WriteTo(w io.Writer) (int64, error) {
	if err := c.Check(); err != nil {
		return 0, err
	}
	if uint64(len(c.Ops)) > math.MaxUint32 {
		return 0, fmt.Errorf("openloop: %d operations: ids are u32", len(c.Ops))
	}
	cw := &countingWriter{w: bufio.NewWriterSize(w, 1<<20)}
	c.writeHeader(cw)
	c.writeSlabs(cw)
	c.writeOps(cw)
	if cw.err == nil {
		cw.err = cw.w.(*bufio.Writer).Flush()
	}
	return cw.n, cw.err
}

func (c *Corpus) writeHeader(cw *countingWriter) {
	t := c.Totals()
	cw.bytes([]byte(Magic))
	cw.u32(Version)
	cw.u32(c.BlockSize)
	cw.u64(uint64(c.ReferenceWindow))
	for _, v := range []uint64{c.TraceDuplication, c.TraceLength, c.WorkerDuplication, c.LogicalWorkers,
		t.Requests, t.StoredEvents, t.RemovedEvents, t.ClearedEvents, t.RequestBlocks, t.StoredBlocks, t.RemovedBlocks} {
		cw.u64(v)
	}
	cw.u64(uint64(len(c.TracePath)))
	cw.bytes([]byte(c.TracePath))
}

// writeSlabs writes the three slabs, each operation's entries in order.
func (c *Corpus) writeSlabs(cw *countingWriter) {
	t := c.Totals()
	cw.u64(t.RequestBlocks)
	for i := range c.Ops {
		for _, h := range c.Ops[i].Query {
			cw.u64(h)
		}
	}
	cw.u64(t.StoredBlocks)
	for i := range c.Ops {
		if d, ok := c.Ops[i].Event.Data.(kvevent.Stored); ok && !c.Ops[i].IsQuery() {
			for _, b := range d.Blocks {
				cw.u64(b.BlockHash)
				cw.u64(b.TokensHash)
			}
		}
	}
	cw.u64(t.RemovedBlocks)
	for i := range c.Ops {
		if d, ok := c.Ops[i].Event.Data.(kvevent.Removed); ok && !c.Ops[i].IsQuery() {
			for _, h := range d.BlockHashes {
				cw.u64(h)
			}
		}
	}
}

func (c *Corpus) writeOps(cw *countingWriter) {
	cw.u64(uint64(len(c.Ops)))
	var q, s, r uint64 // next entry of each slab
	for i := range c.Ops {
		o := &c.Ops[i]
		cw.u32(uint32(i))
		cw.u64(uint64(o.Deadline))
		cw.u64(uint64(o.Worker))
		if o.IsQuery() {
			cw.u8(kindQuery)
			cw.u64(q)
			cw.u32(uint32(len(o.Query)))
			q += uint64(len(o.Query))
			continue
		}
		switch d := o.Event.Data.(type) {
		case kvevent.Stored:
			cw.u8(kindStored)
			cw.u32(uint32(o.Event.DPRank))
			cw.u64(o.Event.ID)
			parent, start := uint64(0), uint32(0) // 0 where absent
			if d.HasParent {
				parent = d.ParentHash
			}
			if o.StartPosition != nil {
				start = *o.StartPosition
			}
			cw.flag(d.HasParent)
			cw.u64(parent)
			cw.flag(o.StartPosition != nil)
			cw.u32(start)
			cw.u64(s)
			cw.u32(uint32(len(d.Blocks)))
			s += uint64(len(d.Blocks))
		case kvevent.Removed:
			cw.u8(kindRemoved)
			cw.u32(uint32(o.Event.DPRank))
			cw.u64(o.Event.ID)
			cw.u64(r)
			cw.u32(uint32(len(d.BlockHashes)))
			r += uint64(len(d.BlockHashes))
		case kvevent.Cleared:
			cw.u8(kindCleared)
			cw.u32(uint32(o.Event.DPRank))
			cw.u64(o.Event.ID)
		}
	}
}

// countingWriter writes little-endian fields, keeping the first error.
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
	buf [8]byte
}

func (cw *countingWriter) bytes(b []byte) {
	if cw.err != nil {
		return
	}
	n, err := cw.w.Write(b)
	cw.n += int64(n)
	cw.err = err
}

func (cw *countingWriter) u8(v uint8) { cw.buf[0] = v; cw.bytes(cw.buf[:1]) }
func (cw *countingWriter) u32(v uint32) {
	binary.LittleEndian.PutUint32(cw.buf[:4], v)
	cw.bytes(cw.buf[:4])
}
func (cw *countingWriter) u64(v uint64) {
	binary.LittleEndian.PutUint64(cw.buf[:8], v)
	cw.bytes(cw.buf[:8])
}
func (cw *countingWriter) flag(b bool) {
	if b {
		cw.u8(1)
	} else {
		cw.u8(0)
	}
}

// WriteFile writes the corpus to path.
func (c *Corpus) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadFile reads and checks the corpus at path.
func ReadFile(path string) (*Corpus, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Read(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ErrCorpus is the error of every corpus Read refuses; the message names
// the offset.
var ErrCorpus = errors.New("openloop: not a valid SMGMCK01 corpus")
