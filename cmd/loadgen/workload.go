package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvradix/kvradix/trace"
)

// workloadFlags select a trace: the embedded default, a file, or a
// synthetic one.
type workloadFlags struct {
	path  string
	synth bool
	cfg   trace.SynthConfig
	burst bool
	bcfg  trace.BurstConfig
}

func (w *workloadFlags) register(fs *flag.FlagSet) {
	d := trace.DefaultSynth()
	fs.StringVar(&w.path, "trace", "", "Mooncake JSONL trace `file` (default: the embedded conversation trace)")
	fs.BoolVar(&w.synth, "synth", false, "use a synthetic workload instead of a trace (see -synth-* flags)")
	fs.Uint64Var(&w.cfg.Seed, "synth-seed", d.Seed, "synthetic workload seed")
	fs.IntVar(&w.cfg.Requests, "synth-requests", d.Requests, "synthetic requests")
	fs.Float64Var(&w.cfg.Rate, "synth-rate", d.Rate, "synthetic Poisson arrival rate, requests/s")
	fs.IntVar(&w.cfg.SystemPrompts, "synth-system-prompts", d.SystemPrompts, "distinct shared system prompts")
	fs.IntVar(&w.cfg.SystemTokens, "synth-system-tokens", d.SystemTokens, "tokens per system prompt")
	fs.Float64Var(&w.cfg.Skew, "synth-skew", d.Skew, "Zipf exponent of system prompt popularity (> 1; 0 = uniform)")
	fs.Float64Var(&w.cfg.NewSession, "synth-new-session", d.NewSession, "probability an arrival opens a new session")
	fs.IntVar(&w.cfg.MaxTurns, "synth-turns", d.MaxTurns, "turns per session")
	fs.IntVar(&w.cfg.UserTokens, "synth-user-tokens", d.UserTokens, "mean new user tokens per turn")
	fs.IntVar(&w.cfg.OutputTokens, "synth-output-tokens", d.OutputTokens, "mean output tokens per turn")
	b := trace.DefaultBurst()
	fs.BoolVar(&w.burst, "burst", false, "use a burst workload instead of a trace: siblings sharing a long prefix, sent within a few ms (see -burst-* flags)")
	fs.Uint64Var(&w.bcfg.Seed, "burst-seed", b.Seed, "burst workload seed")
	fs.IntVar(&w.bcfg.Bursts, "burst-count", b.Bursts, "bursts")
	fs.Float64Var(&w.bcfg.Rate, "burst-rate", b.Rate, "Poisson arrival rate of bursts, per second")
	fs.IntVar(&w.bcfg.Siblings, "burst-siblings", b.Siblings, "requests per burst")
	fs.IntVar(&w.bcfg.PrefixTokens, "burst-prefix-tokens", b.PrefixTokens, "tokens a burst's siblings share")
	fs.IntVar(&w.bcfg.SuffixTokens, "burst-suffix-tokens", b.SuffixTokens, "each sibling's own tokens")
	fs.Float64Var(&w.bcfg.SpreadMs, "burst-spread-ms", b.SpreadMs, "a burst's siblings arrive within this many ms")
	fs.IntVar(&w.bcfg.OutputTokens, "burst-output-tokens", b.OutputTokens, "output tokens per request")
}

// load returns the requests and a name for reports.
func (w *workloadFlags) load() ([]trace.Request, string, error) {
	if n := btoi(w.path != "") + btoi(w.synth) + btoi(w.burst); n > 1 {
		return nil, "", fmt.Errorf("-trace, -synth and -burst are exclusive")
	}
	if w.burst {
		reqs, err := trace.Bursts(w.bcfg)
		return reqs, fmt.Sprintf("bursts (seed %d, %d of %d siblings)", w.bcfg.Seed, w.bcfg.Bursts, w.bcfg.Siblings), err
	}
	if w.synth {
		reqs, err := trace.Synthesize(w.cfg)
		return reqs, fmt.Sprintf("synthetic (seed %d, %d requests)", w.cfg.Seed, w.cfg.Requests), err
	}
	if w.path == "" {
		reqs, err := trace.ReadAll(trace.Default())
		return reqs, trace.DefaultName, err
	}
	f, err := os.Open(w.path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	reqs, err := trace.ReadAll(f)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", w.path, err)
	}
	return reqs, w.path, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
