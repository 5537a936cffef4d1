package openloop

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/kvradix/kvradix/kvevent"
)

// reader reads little-endian fields from a corpus, failing at the first
// field past its end; every error names its offset.
type reader struct {
	data []byte
	off  int
	err  error
}

func (r *reader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: offset %d: %s", ErrCorpus, r.off, fmt.Sprintf(format, a...))
	}
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.data)-r.off < n {
		r.fail("%s: %d bytes, %d left", what, n, len(r.data)-r.off)
		return nil
	}
	b := r.data[r.off : r.off+n]
	r.off += n
	return b
}

func (r *reader) u8(what string) uint8 {
	if b := r.take(1, what); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u32(what string) uint32 {
	if b := r.take(4, what); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64(what string) uint64 {
	if b := r.take(8, what); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// count reads a slab's or a list's count, refusing one whose entries of
// size bytes could not fit in what is left (nothing is allocated for a
// count the file cannot hold).
func (r *reader) count(size int, what string) int {
	at := r.off
	n := r.u64(what + " count")
	if r.err == nil && n > uint64(len(r.data)-r.off)/uint64(size) {
		r.off = at
		r.fail("%s: %d entries of %d bytes, %d bytes left", what, n, size, len(r.data)-at-8)
		return 0
	}
	return int(n)
}

// Read decodes and checks a corpus: the magic and version, every field
// within the data, the slabs' bounds, the operations' order, ids and kinds,
// and the header's totals against the operations. Slices of the returned
// operations share three arrays (one per slab).
func Read(data []byte) (*Corpus, error) {
	r := &reader{data: data}
	c := &Corpus{}
	want := r.header(c)
	queries, stored, removed := r.slabs()
	r.ops(c, queries, stored, removed)
	if r.err == nil && r.off != len(data) {
		r.fail("%d bytes after the operations", len(data)-r.off)
	}
	if r.err != nil {
		return nil, r.err
	}
	if got := c.Totals(); got != want {
		return nil, fmt.Errorf("%w: the header's totals %+v, the operations' %+v", ErrCorpus, want, got)
	}
	return c, nil
}

func (r *reader) header(c *Corpus) Totals {
	if m := r.take(len(Magic), "magic"); m != nil && string(m) != Magic {
		r.off = 0
		r.fail("magic %q, want %q", m, Magic)
	}
	if v := r.u32("version"); r.err == nil && v != Version {
		r.off -= 4
		r.fail("version %d, this reads %d", v, Version)
	}
	c.BlockSize = r.u32("block_size")
	window := r.u64("reference_window_ns")
	if r.err == nil && window > math.MaxInt64 {
		r.off -= 8
		r.fail("reference window %d ns", window)
	}
	c.ReferenceWindow = time.Duration(window)
	c.TraceDuplication = r.u64("trace_duplication_factor")
	c.TraceLength = r.u64("trace_length_factor")
	c.WorkerDuplication = r.u64("inference_worker_duplication_factor")
	c.LogicalWorkers = r.u64("logical_workers")
	var t Totals
	for _, f := range []*uint64{&t.Requests, &t.StoredEvents, &t.RemovedEvents, &t.ClearedEvents, &t.RequestBlocks, &t.StoredBlocks, &t.RemovedBlocks} {
		*f = r.u64("totals")
	}
	n := r.count(1, "trace path")
	c.TracePath = string(r.take(n, "trace path"))
	return t
}

// slabs reads the query, stored and removed slabs.
func (r *reader) slabs() (queries []uint64, stored []kvevent.StoredBlock, removed []uint64) {
	queries = make([]uint64, r.count(8, "query slab"))
	for i := range queries {
		queries[i] = r.u64("query slab")
	}
	stored = make([]kvevent.StoredBlock, r.count(16, "stored slab"))
	for i := range stored {
		stored[i] = kvevent.StoredBlock{BlockHash: r.u64("stored slab"), TokensHash: r.u64("stored slab")}
	}
	removed = make([]uint64, r.count(8, "removed slab"))
	for i := range removed {
		removed[i] = r.u64("removed slab")
	}
	return queries, stored, removed
}

// span returns slab[start:start+n] after checking it is within the slab.
func span[T any](r *reader, slab []T, start uint64, n uint32, what string, at int) []T {
	if r.err != nil {
		return nil
	}
	if start > uint64(len(slab)) || uint64(n) > uint64(len(slab))-start {
		r.off = at
		r.fail("%s [%d, +%d) past the slab's %d entries", what, start, n, len(slab))
		return nil
	}
	return slab[start : start+uint64(n) : start+uint64(n)]
}

// opMin is the smallest operation (a query or a clear, 33 bytes).
const opMin = 33

func (r *reader) ops(c *Corpus, queries []uint64, stored []kvevent.StoredBlock, removed []uint64) {
	c.Ops = make([]Op, r.count(opMin, "operations"))
	for i := range c.Ops {
		at := r.off
		o := &c.Ops[i]
		if id := r.u32("id"); r.err == nil && id != uint32(i) {
			r.off = at
			r.fail("operation %d has id %d", i, id)
		}
		deadline := r.u64("deadline_ns")
		if r.err == nil && deadline > math.MaxInt64 {
			r.off = at
			r.fail("operation %d: deadline %d ns", i, deadline)
		}
		o.Deadline = time.Duration(deadline)
		o.Worker = kvevent.WorkerID(r.u64("worker_id"))
		r.op(o, i, at, queries, stored, removed)
		if r.err == nil && i > 0 && compareOps(&c.Ops[i-1], o) > 0 {
			r.off = at
			r.fail("operation %d comes before operation %d in issue order (deadline, queries first, worker)", i, i-1)
		}
		if r.err != nil {
			return
		}
	}
}

// op reads one operation's kind and its fields.
func (r *reader) op(o *Op, i, at int, queries []uint64, stored []kvevent.StoredBlock, removed []uint64) {
	switch kind := r.u8("kind"); {
	case r.err != nil:
	case kind == kindQuery:
		start, n := r.u64("start"), r.u32("len")
		o.Query = span(r, queries, start, n, fmt.Sprintf("operation %d's hashes", i), at)
		if o.Query == nil && r.err == nil {
			o.Query = []uint64{}
		}
	case kind == kindStored:
		o.Event.DPRank, o.Event.ID = kvevent.DPRank(r.u32("dp_rank")), r.u64("event_id")
		var d kvevent.Stored
		d.HasParent = r.flag("has_parent")
		if parent := r.u64("parent"); d.HasParent {
			d.ParentHash = parent
		}
		if r.flag("has_start_position") {
			p := r.u32("start_position")
			o.StartPosition = &p
		} else {
			r.u32("start_position")
		}
		start, n := r.u64("start"), r.u32("len")
		d.Blocks = span(r, stored, start, n, fmt.Sprintf("operation %d's blocks", i), at)
		o.Event.Data = d
	case kind == kindRemoved:
		o.Event.DPRank, o.Event.ID = kvevent.DPRank(r.u32("dp_rank")), r.u64("event_id")
		start, n := r.u64("start"), r.u32("len")
		o.Event.Data = kvevent.Removed{BlockHashes: span(r, removed, start, n, fmt.Sprintf("operation %d's hashes", i), at)}
	case kind == kindCleared:
		o.Event.DPRank, o.Event.ID = kvevent.DPRank(r.u32("dp_rank")), r.u64("event_id")
		o.Event.Data = kvevent.Cleared{}
	default:
		r.off--
		r.fail("operation %d: kind %d", i, kind)
	}
}

// flag reads a u8 that must be 0 or 1.
func (r *reader) flag(what string) bool {
	v := r.u8(what)
	if r.err == nil && v > 1 {
		r.off--
		r.fail("%s %d, want 0 or 1", what, v)
	}
	return v == 1
}
