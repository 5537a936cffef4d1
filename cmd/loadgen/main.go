// Command loadgen drives kvradix: it replays traces through mock engines
// (replay), stresses the indexers (indexer) and the router core (router),
// and ingests vLLM events over ZeroMQ (ingest). Run `loadgen help`.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt)
	if err := run(os.Args[1:], os.Stdout, os.Stderr, stop); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
		}
		os.Exit(2)
	}
}

const usage = `usage: loadgen <command> [flags]

commands:
  replay    replay a trace through mock engines under each router; compare TTFT, reuse
  indexer   replay a trace's KV events and matches against each index, compressed in time
  corpus    write the indexer's corpus in the field's SMGMCK01 format (indexer -corpus replays one)
  memory    the index's live bytes a membership over the replay (Dynamo's indexer_memory)
  holes     workers evict mid-chain blocks and keep later ones; every lookup checked against a model
  router    drive the full router path at an offered request rate
  ingest    vLLM engines publish over ZeroMQ into the subscriber and indexer
  cluster   router replicas over NATS JetStream: one router, N sharing load, N not
  serve     kvradix serve (in-process, or -url) under engines publishing and HTTP clients querying

Run 'loadgen <command> -h' for a command's flags.
`

// run is the whole program: a function of its arguments and writers. stop
// delivers SIGINT: long commands stop early and still report.
func run(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command")
	}
	switch args[0] {
	case "replay":
		return runReplay(args[1:], stdout, stderr, stop)
	case "indexer":
		return runIndexer(args[1:], stdout, stderr, stop)
	case "corpus":
		return runCorpus(args[1:], stdout, stderr)
	case "memory":
		return runMemory(args[1:], stdout, stderr)
	case "holes":
		return runHoles(args[1:], stdout, stderr)
	case "router":
		return runRouter(args[1:], stdout, stderr, stop)
	case "ingest":
		return runIngest(args[1:], stdout, stderr, stop)
	case "cluster":
		return runCluster(args[1:], stdout, stderr, stop)
	case "serve":
		return runServe(args[1:], stdout, stderr, stop)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// interrupt is SIGINT as a command sees it: a flag to poll and a channel to
// select on, so that no wait outlives it.
type interrupt struct {
	flag atomic.Bool
	c    chan struct{}
}

// Load reports whether the interrupt came.
func (i *interrupt) Load() bool { return i.flag.Load() }

// C is closed when the interrupt comes.
func (i *interrupt) C() <-chan struct{} { return i.c }

// sleep waits d, or until the interrupt; it reports false if interrupted.
func (i *interrupt) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-i.c:
		return false
	case <-t.C:
		return true
	}
}

// context returns a context cancelled by the interrupt (or by cancel).
func (i *interrupt) context() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-i.c:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// errInterrupted is every command's error after SIGINT; the output before
// it is partial.
var errInterrupted = errors.New("interrupted: the results above are partial")

// watch turns stop's first signal into an interrupt; release ends the watch.
func watch(stop <-chan os.Signal) (*interrupt, func()) {
	intr := &interrupt{c: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		select {
		case <-stop:
			intr.flag.Store(true)
			close(intr.c)
		case <-done:
		}
	}()
	return intr, func() { close(done) }
}

// output is every command's -format (table, json or bench) and -json, its
// alias for -format json. The indexer's json is Dynamo's result JSON, a
// line per run (v4, its old name, is a synonym).
type output struct{ format string }

func (o *output) register(fs *flag.FlagSet) {
	o.format = "table"
	fs.StringVar(&o.format, "format", o.format, "output: table, json, or bench (Go benchmark lines for benchstat)")
	fs.BoolFunc("json", "same as -format json", func(v string) error {
		if v != "false" {
			o.format = "json"
		}
		return nil
	})
}

func (o *output) validate() error {
	switch o.format {
	case "table", "json", "bench", "v4":
		return nil
	}
	return fmt.Errorf("-format %q, want table, json, bench or v4 (v4: json's synonym)", o.format)
}

// writeLines prints each of vs as a line of JSON (json or its synonym
// v4), or calls the table or bench printer.
func writeLines[T any](o output, w io.Writer, vs []T, table, bench func()) error {
	switch o.format {
	case "json", "v4":
		enc := json.NewEncoder(w)
		for _, v := range vs {
			if err := enc.Encode(v); err != nil {
				return err
			}
		}
	case "bench":
		bench()
	default:
		table()
	}
	return nil
}

// write prints v as JSON, or calls the table or bench printer.
func (o *output) write(w io.Writer, v any, table, bench func()) error {
	switch o.format {
	case "json", "v4":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "bench":
		bench()
	default:
		table()
	}
	return nil
}

// commandLine is the command as run, for a report's provenance.
func commandLine(cmd string, args []string) string {
	return strings.Join(append([]string{"loadgen", cmd}, args...), " ")
}

// profile is a -cpuprofile or -memprofile file. It is created when the
// command starts, so that a path that cannot be written is refused before
// the run, not after it, and it is removed at the end if the run never
// wrote it. A nil *profile (no path given) does nothing.
type profile struct {
	f       *os.File
	written bool
}

// profiles are a run's CPU and heap profiles (nil where not asked for).
type profiles struct{ cpu, mem *profile }

// createProfiles creates the profiles asked for ("" for none), or none.
func createProfiles(cpu, mem string) (profiles, error) {
	var p profiles
	var err error
	if p.cpu, err = createProfile(cpu); err != nil {
		return profiles{}, err
	}
	if p.mem, err = createProfile(mem); err != nil {
		p.cpu.close()
		return profiles{}, err
	}
	return p, nil
}

func (p profiles) close() {
	p.cpu.close()
	p.mem.close()
}

func createProfile(path string) (*profile, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &profile{f: f}, nil
}

// startCPU starts a CPU profile into p and returns its stop.
func (p *profile) startCPU() (func(), error) {
	if p == nil {
		return func() {}, nil
	}
	if err := pprof.StartCPUProfile(p.f); err != nil {
		return nil, err
	}
	p.written = true
	return pprof.StopCPUProfile, nil
}

// writeHeap writes a heap profile into p, after a collection.
func (p *profile) writeHeap() error {
	if p == nil {
		return nil
	}
	runtime.GC()
	p.written = true
	return pprof.WriteHeapProfile(p.f)
}

// close closes p's file, and removes it if nothing was written to it.
func (p *profile) close() {
	if p == nil {
		return
	}
	p.f.Close()
	if !p.written {
		os.Remove(p.f.Name())
	}
}

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("loadgen "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args into fs and refuses any argument left over.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}
