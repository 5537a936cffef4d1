package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kvradix/kvradix/openloop"
)

// runCorpus writes the indexer's corpus, built from the trace as `loadgen
// indexer` builds it, in the field's SMGMCK01 format (package openloop),
// byte for byte the same for the same flags.
func runCorpus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("corpus", stderr)
	var c indexerConfig
	c.work.register(fs)
	c.registerCorpus(fs)
	c.registerWindow(fs)
	out := fs.String("out", "", "the corpus file to write (required); the standard settings: -workers 128 -dup 20 -length-factor 4 -block-size 128")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("corpus: -out FILE is required")
	}
	if fi, err := os.Stat(*out); err == nil && fi.IsDir() {
		return fmt.Errorf("corpus: -out %s is a directory", *out)
	}
	// The corpus is written beside -out and renamed over it once whole:
	// a path that cannot be written is refused before the build, -out is
	// never left half written, and it may be the -corpus it is made from.
	tmp, err := os.CreateTemp(filepath.Dir(*out), filepath.Base(*out)+".*.tmp")
	if err != nil {
		return fmt.Errorf("corpus: -out: %w", err)
	}
	defer os.Remove(tmp.Name()) // nothing left there once renamed
	defer tmp.Close()
	oc, err := c.buildCorpus(c.progress(stderr))
	if err != nil {
		return err
	}
	if err := writeCorpus(oc, tmp, *out); err != nil {
		return fmt.Errorf("corpus: %w", err)
	}
	t := oc.Totals()
	fmt.Fprintf(stdout, "corpus %s: %d operations (%d requests, %d stored, %d removed, %d cleared), %d block ops, window %v, %d workers\n",
		*out, len(oc.Ops), t.Requests, t.StoredEvents, t.RemovedEvents, t.ClearedEvents, t.BlockOps(), oc.ReferenceWindow, oc.LogicalWorkers)
	return nil
}

// writeCorpus writes oc into tmp and renames it to path.
func writeCorpus(oc *openloop.Corpus, tmp *os.File, path string) error {
	if _, err := oc.WriteTo(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
