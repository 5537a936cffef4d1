package trace

import (
	"fmt"
	"math/rand/v2"
)

// SynthConfig shapes a synthetic multi-turn chat workload.
type SynthConfig struct {
	Seed          uint64
	Requests      int     // requests to generate
	Rate          float64 // mean arrivals per second (Poisson)
	SystemPrompts int     // distinct shared system prompts
	SystemTokens  int     // tokens of each system prompt
	Skew          float64 // Zipf exponent of system-prompt popularity (> 1), 0 for uniform
	NewSession    float64 // probability that an arrival opens a new session
	MaxTurns      int     // turns after which a session ends
	UserTokens    int     // mean new user tokens per turn
	OutputTokens  int     // mean output tokens per turn
}

// MaxSynthRate bounds SynthConfig.Rate: past it, arrival times in ms no
// longer move forward.
const MaxSynthRate = 1e9

// DefaultSynth returns a moderate chat workload.
func DefaultSynth() SynthConfig {
	return SynthConfig{
		Seed: 1, Requests: 2000, Rate: 20, SystemPrompts: 16, SystemTokens: 2048, Skew: 1.2,
		NewSession: 0.3, MaxTurns: 8, UserTokens: 600, OutputTokens: 250,
	}
}

// Validate reports the first invalid knob.
func (c SynthConfig) Validate() error {
	switch {
	case c.Requests < 1:
		return fmt.Errorf("synth: requests %d, want >= 1", c.Requests)
	case !(c.Rate > 0 && c.Rate <= MaxSynthRate):
		return fmt.Errorf("synth: rate %v, want in (0, %g] requests/s", c.Rate, MaxSynthRate)
	case c.SystemPrompts < 1:
		return fmt.Errorf("synth: system prompts %d, want >= 1", c.SystemPrompts)
	case c.SystemTokens < 0:
		return fmt.Errorf("synth: system tokens %d, want >= 0", c.SystemTokens)
	case c.Skew != 0 && !(c.Skew > 1):
		return fmt.Errorf("synth: skew %v, want 0 (uniform) or > 1", c.Skew)
	case !(c.NewSession >= 0 && c.NewSession <= 1):
		return fmt.Errorf("synth: new-session probability %v, want in [0, 1]", c.NewSession)
	case c.MaxTurns < 1:
		return fmt.Errorf("synth: max turns %d, want >= 1", c.MaxTurns)
	case c.UserTokens < 1:
		return fmt.Errorf("synth: user tokens %d, want >= 1", c.UserTokens)
	case c.OutputTokens < 1:
		return fmt.Errorf("synth: output tokens %d, want >= 1", c.OutputTokens)
	}
	return nil
}

type session struct {
	ids    []uint64 // hash ids of the last prompt
	tokens int      // its length
	output int      // its output length
	turns  int
}

// Synthesize generates a workload in trace form: sessions open on a system
// prompt chosen by Zipf popularity, and each later turn's prompt extends the
// previous prompt and output with new user tokens; arrivals are Poisson.
// Equal (seeded) configurations give equal workloads.
func Synthesize(c SynthConfig) ([]Request, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(c.Seed, 0x73796e7468))
	var zipf *rand.Zipf
	if c.Skew > 1 {
		zipf = rand.NewZipf(r, c.Skew, 1, uint64(c.SystemPrompts-1))
	}
	next := uint64(0)
	fresh := func() uint64 { next++; return next - 1 }
	sysIDs := make([][]uint64, c.SystemPrompts)
	for i := range sysIDs {
		for range c.SystemTokens / TraceBlockSize {
			sysIDs[i] = append(sysIDs[i], fresh())
		}
	}
	around := func(mean int) int { return 1 + r.IntN(2*mean) }
	var open []*session
	out := make([]Request, 0, c.Requests)
	t := 0.0
	for range c.Requests {
		t += r.ExpFloat64() / c.Rate * 1000
		var s *session
		var keep []uint64
		var length int
		if len(open) == 0 || r.Float64() < c.NewSession {
			sys := 0
			if zipf != nil {
				sys = int(zipf.Uint64())
			} else {
				sys = r.IntN(c.SystemPrompts)
			}
			s = &session{}
			open = append(open, s)
			keep = sysIDs[sys]
			length = c.SystemTokens + around(c.UserTokens)
		} else {
			i := r.IntN(len(open))
			s = open[i]
			keep = s.ids[:s.tokens/TraceBlockSize] // full blocks are unchanged
			length = s.tokens + s.output + around(c.UserTokens)
		}
		ids := append([]uint64(nil), keep...)
		for len(ids) < (length+TraceBlockSize-1)/TraceBlockSize {
			ids = append(ids, fresh())
		}
		s.ids, s.tokens, s.output = ids, length, around(c.OutputTokens)
		s.turns++
		out = append(out, Request{Timestamp: t, InputLength: length, OutputLength: s.output, HashIDs: ids})
		if s.turns >= c.MaxTurns {
			for i, o := range open {
				if o == s {
					open = append(open[:i], open[i+1:]...)
					break
				}
			}
		}
	}
	return out, nil
}
