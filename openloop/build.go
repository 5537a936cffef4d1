package openloop

import (
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/replay"
	"github.com/kvradix/kvradix/trace"
)

// BuildConfig is how Build makes a corpus from a trace: the field's
// parameters (Dynamo's standard settings are 128 workers, blocks of 128
// tokens, 512 tokens per trace hash id, duplication 20, length factor 4).
type BuildConfig struct {
	Trace          string `json:"trace"`            // the trace's name, for reports
	Workers        int    `json:"workers"`          // simulated engines, before Dup
	BlockSize      int    `json:"block_size"`       // tokens per KV block
	TraceBlockSize int    `json:"trace_block_size"` // tokens per trace hash id
	Blocks         int    `json:"blocks"`           // KV blocks per engine
	Dup            int    `json:"dup"`              // copies in disjoint hash spaces, each with its own workers
	LengthFactor   int    `json:"length_factor"`    // each hash id stretched into this many
	Seed           uint64 `json:"seed"`             // request-to-engine spread
}

// Validate names the first parameter out of range, by its loadgen flag.
func (c BuildConfig) Validate() error {
	switch {
	case c.Workers < 1:
		return fmt.Errorf("-workers %d, want >= 1", c.Workers)
	case c.Dup < 1 || c.Dup > MaxDup:
		return fmt.Errorf("-dup %d, want in [1, %d]", c.Dup, MaxDup)
	case c.Workers > MaxLogicalWorkers/c.Dup:
		return fmt.Errorf("-workers %d x -dup %d, want at most %d workers in all", c.Workers, c.Dup, MaxLogicalWorkers)
	case c.LengthFactor < 1 || c.LengthFactor > 64:
		return fmt.Errorf("-length-factor %d, want in [1, 64]", c.LengthFactor)
	case c.TraceBlockSize < 1 || c.TraceBlockSize > 1<<16:
		return fmt.Errorf("-trace-block-size %d, want in [1, 65536]", c.TraceBlockSize)
	}
	return nil
}

// Bounds of a corpus Build makes: its workers after duplication, as many
// as a router takes, and its block operations, about 16 bytes each in
// memory (the standard corpus has 320M).
const (
	MaxDup            = 1024
	MaxLogicalWorkers = 1 << 24
	MaxBlockOps       = 1 << 30
)

// Build stretches the requests, runs them through the mock engines (package
// replay), makes the copies, normalises each worker's timeline to start at
// zero and rescales it to window, and merges the whole into issue order
// (deadline, queries first, worker, trace order). Event ids are the
// operation's position plus one, so they are unique and rise along each
// worker.
func Build(reqs []trace.Request, cfg BuildConfig, window time.Duration) (*Corpus, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	stretched := make([]trace.Request, len(reqs))
	for i, r := range reqs {
		stretched[i] = trace.Stretch(r, cfg.LengthFactor, cfg.TraceBlockSize)
	}
	rc := replay.DefaultConfig()
	rc.Workers, rc.BlockSize, rc.TraceBlockSize, rc.Blocks, rc.Seed = cfg.Workers, cfg.BlockSize, cfg.TraceBlockSize, cfg.Blocks, cfg.Seed
	src, err := replay.Workload(stretched, rc)
	if err != nil {
		return nil, err
	}
	if n := blockOps(src); n > MaxBlockOps/uint64(cfg.Dup) {
		return nil, fmt.Errorf("-dup %d copies of %d block ops (-length-factor %d), want at most %d in all", cfg.Dup, n, cfg.LengthFactor, MaxBlockOps)
	}
	src = duplicate(src, cfg.Dup, cfg.Workers)
	c := &Corpus{Header: Header{BlockSize: uint32(cfg.BlockSize), ReferenceWindow: window, TraceDuplication: uint64(cfg.Dup),
		TraceLength: uint64(cfg.LengthFactor), WorkerDuplication: 1, LogicalWorkers: uint64(cfg.Workers * cfg.Dup), TracePath: cfg.Trace},
		Ops: make([]Op, len(src))}
	first := make(map[kvevent.WorkerID]float64, cfg.Workers*cfg.Dup)
	last := make(map[kvevent.WorkerID]float64, cfg.Workers*cfg.Dup)
	for _, op := range src {
		if t, ok := first[op.Worker]; !ok || op.T < t {
			first[op.Worker] = op.T
		}
		last[op.Worker] = max(last[op.Worker], op.T)
	}
	for i, op := range src {
		o := &c.Ops[i]
		o.Worker, o.Query, o.Event = op.Worker, op.Match, op.Event
		if span := last[op.Worker] - first[op.Worker]; span > 0 {
			o.Deadline = time.Duration((op.T - first[op.Worker]) / span * float64(window))
		}
	}
	// A stable sort keeps source order among equal keys; src is in time
	// order, so every worker's operations stay in their order.
	slices.SortStableFunc(c.Ops, func(a, b Op) int { return compareOps(&a, &b) })
	c.number()
	return c, nil
}

// number sets every event's id to its position plus one.
func (c *Corpus) number() {
	for i := range c.Ops {
		if !c.Ops[i].IsQuery() {
			c.Ops[i].Event.ID = uint64(i) + 1
		}
	}
}

// positional returns c if every event's id is its position plus one (as
// Build numbers them), or else a copy so numbered: a run keys events by
// their id, and another exporter's ids are its own.
func (c *Corpus) positional() *Corpus {
	for i := range c.Ops {
		if !c.Ops[i].IsQuery() && c.Ops[i].Event.ID != uint64(i)+1 {
			out := *c
			out.Ops = slices.Clone(c.Ops)
			out.number()
			return &out
		}
	}
	return c
}

// Rescaled returns c with every deadline scaled to the window w (c itself
// when w is its window; the operations' payloads are shared).
func (c *Corpus) Rescaled(w time.Duration) *Corpus {
	if w == c.ReferenceWindow || c.ReferenceWindow <= 0 {
		return c
	}
	out := *c
	out.ReferenceWindow = w
	out.Ops = slices.Clone(c.Ops)
	for i := range out.Ops {
		out.Ops[i].Deadline = time.Duration(float64(c.Ops[i].Deadline) * float64(w) / float64(c.ReferenceWindow))
	}
	return &out
}

// blockOps is the block operations of ops.
func blockOps(ops []replay.Op) uint64 {
	n := uint64(0)
	for i := range ops {
		n += uint64(ops[i].Blocks())
	}
	return n
}

// duplicate appends d-1 copies of ops in disjoint worker and hash spaces.
func duplicate(ops []replay.Op, d, workers int) []replay.Op {
	if d == 1 {
		return ops
	}
	out := make([]replay.Op, 0, len(ops)*d)
	for _, op := range ops {
		for k := range d {
			out = append(out, salted(op, k, workers))
		}
	}
	return out
}

// salted moves op into copy k: worker ids shift by k·workers, every hash is
// xor-ed with a per-copy salt.
func salted(op replay.Op, k, workers int) replay.Op {
	if k == 0 {
		return op
	}
	salt := bits.RotateLeft64(uint64(k)*0x9E3779B97F4A7C15, 17) | 1
	op.Worker += kvevent.WorkerID(k * workers)
	if op.Match != nil {
		m := make([]uint64, len(op.Match))
		for i, h := range op.Match {
			m[i] = h ^ salt
		}
		op.Match = m
		return op
	}
	switch d := op.Event.Data.(type) {
	case kvevent.Stored:
		s := kvevent.Stored{HasParent: d.HasParent, ParentHash: d.ParentHash ^ salt, Blocks: make([]kvevent.StoredBlock, len(d.Blocks))}
		for i, b := range d.Blocks {
			s.Blocks[i] = kvevent.StoredBlock{BlockHash: b.BlockHash ^ salt, TokensHash: b.TokensHash ^ salt}
		}
		op.Event.Data = s
	case kvevent.Removed:
		r := kvevent.Removed{BlockHashes: make([]uint64, len(d.BlockHashes))}
		for i, h := range d.BlockHashes {
			r.BlockHashes[i] = h ^ salt
		}
		op.Event.Data = r
	}
	return op
}
