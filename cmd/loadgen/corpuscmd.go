package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kvradix/kvradix/openloop"
)

// runCorpus writes the indexer's corpus, built from the trace as `loadgen
// indexer` builds it, in the field's SMGMCK01 format (package openloop),
// byte for byte the same for the same flags.
func runCorpus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("corpus", stderr)
	var c indexerConfig
	c.register(fs)
	out := fs.String("out", "", "the corpus file to write (required); the standard settings: -workers 128 -dup 20 -length-factor 4 -block-size 128")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("corpus: unexpected argument %q", fs.Arg(0))
	case *out == "":
		return errors.New("corpus: -out FILE is required")
	}
	if err := c.validate(); err != nil {
		return err
	}
	cp, err := c.buildCorpus(c.progress(stderr))
	if err != nil {
		return err
	}
	oc := cp.openloop()
	if err := oc.WriteFile(*out); err != nil {
		return fmt.Errorf("corpus: %w", err)
	}
	t := oc.Totals()
	fmt.Fprintf(stdout, "corpus %s: %d operations (%d requests, %d stored, %d removed, %d cleared), %d block ops, window %v, %d workers\n",
		*out, len(oc.Ops), t.Requests, t.StoredEvents, t.RemovedEvents, t.ClearedEvents, t.BlockOps(), oc.ReferenceWindow, oc.LogicalWorkers)
	return nil
}

// openloop returns the corpus in the field's format.
func (c *corpus) openloop() *openloop.Corpus {
	oc := &openloop.Corpus{Header: openloop.Header{BlockSize: uint32(c.cfg.BlockSize), ReferenceWindow: c.window,
		TraceDuplication: uint64(c.cfg.Dup), TraceLength: uint64(c.cfg.LengthFactor), WorkerDuplication: 1,
		LogicalWorkers: uint64(c.workers), TracePath: c.cfg.Trace}, Ops: make([]openloop.Op, len(c.ops))}
	for i, o := range c.ops {
		oc.Ops[i] = openloop.Op{Deadline: o.at, Worker: o.worker, Query: o.query, Event: o.ev}
	}
	return oc
}

// loadCorpus reads an SMGMCK01 corpus as the indexer's corpus, its
// deadlines rescaled to window (0: the corpus's reference window).
func loadCorpus(path string, window time.Duration) (*corpus, error) {
	oc, err := openloop.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if oc.ReferenceWindow <= 0 {
		return nil, fmt.Errorf("%s: a reference window of %v: the deadlines cannot be scaled", path, oc.ReferenceWindow)
	}
	if window == 0 {
		window = oc.ReferenceWindow
	}
	c := &corpus{cfg: corpusConfig{Trace: path, BlockSize: int(oc.BlockSize), Dup: int(oc.TraceDuplication), LengthFactor: int(oc.TraceLength)},
		window: oc.ReferenceWindow, workers: int(oc.LogicalWorkers), ops: make([]corpusOp, len(oc.Ops))}
	for i, o := range oc.Ops {
		c.ops[i] = corpusOp{at: o.Deadline, worker: o.Worker, query: o.Query, ev: o.Event}
		if !c.ops[i].isQuery() {
			// The run keys each event by its position (as buildCorpus
			// numbers them); another exporter's event ids are its own.
			c.ops[i].ev.ID = uint64(i) + 1
		}
		c.count(&c.ops[i])
	}
	return c.rescaled(window), nil
}
