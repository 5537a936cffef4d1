// Command loadgen drives kvradix: it replays traces through mock engines
// (replay), stresses the indexers (indexer) and the router core (router),
// and ingests vLLM events over ZeroMQ (ingest). Run `loadgen help`.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
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
  router    drive the full router path at an offered request rate
  ingest    vLLM engines publish over ZeroMQ into the subscriber and indexer

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
		return runReplay(args[1:], stdout, stderr)
	case "indexer":
		return runIndexer(args[1:], stdout, stderr, stop)
	case "router":
		return runRouter(args[1:], stdout, stderr, stop)
	case "ingest":
		return runIngest(args[1:], stdout, stderr, stop)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// watch sets the returned flag when stop delivers; release ends the watch.
func watch(stop <-chan os.Signal) (*atomic.Bool, func()) {
	stopped := &atomic.Bool{}
	done := make(chan struct{})
	go func() {
		select {
		case <-stop:
			stopped.Store(true)
		case <-done:
		}
	}()
	return stopped, func() { close(done) }
}

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("loadgen "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
