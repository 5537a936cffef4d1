package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/kvradix/kvradix/openloop"
)

// runSustained searches the sustained rate of one indexer (args name it,
// with -compare and -lanes) by the field's threshold protocol
// (openloop.FindSustained), then confirms it in trials more runs
// (openloop.Sustained.Confirm): each run a fresh process, reported on
// stderr as it ends.
func runSustained(args []string, window time.Duration, trials int, out output, stdout, stderr io.Writer, intr *interrupt) error {
	child := childArgs(args)
	runAs := func(what string) func(w time.Duration, k int) (*openloop.Result, error) {
		return func(w time.Duration, k int) (*openloop.Result, error) {
			rs, err := runChild(append(child, "-duration", w.String()), stderr, intr)
			if err != nil {
				return nil, err
			}
			if len(rs) != 1 {
				return nil, fmt.Errorf("%d results: name one indexer with -compare and -lanes", len(rs))
			}
			r := rs[0]
			fmt.Fprintf(stderr, "window %v, %s %d: %.3gM block-ops/s offered, %.3gM achieved, kept up %v, generator valid %v, %.3gM per second of the index's CPU\n",
				w, what, k+1, r.OfferedBlockOpsPerSec/1e6, r.AchievedBlockOpsPerSec/1e6, r.KeptUp, r.GeneratorValid, r.AchievedBlockOpsPerLaneCPU/1e6)
			return r, nil
		}
	}
	rep, err := openloop.FindSustained(window, maxDuration, runAs("process"), intr.Load)
	if err == nil {
		err = rep.Confirm(trials, runAs("trial"), intr.Load)
	}
	// What was measured is reported even where a process failed: a search
	// takes minutes.
	rep.Command = commandLine("indexer", args)
	werr := out.write(stdout, rep, func() {
		fmt.Fprintf(stdout, "sustained: %.3gM block-ops/s (%.3gM per second of the index's CPU), %d points\n",
			rep.BlockOpsPerSec/1e6, rep.PerLaneCPU/1e6, len(rep.Points))
		if t := rep.Trials; t != nil {
			fmt.Fprintf(stdout, "trials: %d at %.3gM offered, %.0f%% passed; per second of the index's CPU %s; A/A ratio %.3f [%.3f, %.3f]\n",
				len(t.Runs), t.OfferedBlockOpsPerSec/1e6, 100*t.PassedFraction, millions(t.BlockOpsPerLaneCPU),
				t.AAPerLaneCPURatio.Median, t.AAPerLaneCPURatio.CI95[0], t.AAPerLaneCPURatio.CI95[1])
		}
	}, func() {})
	switch {
	case err != nil:
		return err
	case werr != nil:
		return werr
	case intr.Load():
		return errInterrupted
	}
	return nil
}

// childArgs returns the arguments of a search's fresh processes: args
// (parsed already) without -sustained and -trials, in any of their forms.
func childArgs(args []string) []string {
	var child []string
	for i := 0; i < len(args); i++ {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		switch {
		case !strings.HasPrefix(args[i], "-"):
			child = append(child, args[i])
		case name == "sustained":
		case name == "trials":
			if !hasValue {
				i++ // its value is the next argument
			}
		default:
			child = append(child, args[i])
		}
	}
	return child
}

// millions formats an estimate in millions: the median and its interval.
func millions(e openloop.Estimate) string {
	return fmt.Sprintf("%.3gM [%.3gM, %.3gM]", e.Median/1e6, e.CI95[0]/1e6, e.CI95[1]/1e6)
}

// runChild runs `loadgen indexer args` once in a fresh process and reads
// its results (a JSON line each).
func runChild(args []string, stderr io.Writer, intr *interrupt) ([]*openloop.Result, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctx, cancel := intr.context()
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, append(append([]string{"indexer"}, args...), "-repeat", "1", "-format", "json", "-quiet")...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, stderr
	if err := cmd.Run(); err != nil {
		return nil, err
	}
	return readResults(&buf)
}

// readResults reads results written a JSON line each.
func readResults(r io.Reader) ([]*openloop.Result, error) {
	var out []*openloop.Result
	dec := json.NewDecoder(r)
	for dec.More() {
		var res openloop.Result
		if err := dec.Decode(&res); err != nil {
			return nil, fmt.Errorf("result %d: %w", len(out)+1, err)
		}
		out = append(out, &res)
	}
	return out, nil
}
