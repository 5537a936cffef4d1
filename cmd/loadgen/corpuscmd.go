package main

import (
	"errors"
	"fmt"
	"io"
)

// runCorpus writes the indexer's corpus, built from the trace as `loadgen
// indexer` builds it, in the field's SMGMCK01 format (package openloop),
// byte for byte the same for the same flags.
func runCorpus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("corpus", stderr)
	var c indexerConfig
	c.register(fs)
	out := fs.String("out", "", "the corpus file to write (required); the standard settings: -workers 128 -dup 20 -length-factor 4 -block-size 128")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("corpus: -out FILE is required")
	}
	oc, err := c.buildCorpus(c.progress(stderr))
	if err != nil {
		return err
	}
	if err := oc.WriteFile(*out); err != nil {
		return fmt.Errorf("corpus: %w", err)
	}
	t := oc.Totals()
	fmt.Fprintf(stdout, "corpus %s: %d operations (%d requests, %d stored, %d removed, %d cleared), %d block ops, window %v, %d workers\n",
		*out, len(oc.Ops), t.Requests, t.StoredEvents, t.RemovedEvents, t.ClearedEvents, t.BlockOps(), oc.ReferenceWindow, oc.LogicalWorkers)
	return nil
}
