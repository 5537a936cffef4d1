package trace

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
)

// BurstConfig shapes a workload of bursts: groups of sibling requests that
// share a long prompt prefix (one agent's fan-out, a batch of evaluations
// over one document) and arrive within a few milliseconds of each other,
// before the first's prefix can be computed and published.
type BurstConfig struct {
	Seed         uint64
	Bursts       int     // bursts to generate
	Rate         float64 // mean bursts per second (Poisson)
	Siblings     int     // requests per burst
	PrefixTokens int     // tokens the siblings of a burst share (a new prefix per burst)
	SuffixTokens int     // each sibling's own tokens after the prefix
	SpreadMs     float64 // siblings arrive uniformly within this many ms of the burst
	OutputTokens int     // output tokens per request
}

// DefaultBurst returns bursts of 8 siblings sharing 8,192 tokens, sent
// within 5 ms, 4 bursts a second.
func DefaultBurst() BurstConfig {
	return BurstConfig{Seed: 1, Bursts: 400, Rate: 4, Siblings: 8, PrefixTokens: 8192, SuffixTokens: 512, SpreadMs: 5, OutputTokens: 64}
}

// Validate reports the first invalid knob.
func (c BurstConfig) Validate() error {
	switch {
	case c.Bursts < 1 || c.Siblings < 1 || c.Bursts > 1<<24/c.Siblings:
		return fmt.Errorf("burst: %d bursts of %d siblings, want >= 1 each and at most %d requests", c.Bursts, c.Siblings, 1<<24)
	case !(c.Rate > 0 && c.Rate <= MaxSynthRate):
		return fmt.Errorf("burst: rate %v, want in (0, %g] bursts/s", c.Rate, MaxSynthRate)
	case c.PrefixTokens < 0 || c.SuffixTokens < 1 || c.PrefixTokens > 1<<24 || c.SuffixTokens > 1<<24:
		return fmt.Errorf("burst: prefix %d and suffix %d tokens, want prefix >= 0, suffix >= 1, each at most %d", c.PrefixTokens, c.SuffixTokens, 1<<24)
	case !(c.SpreadMs >= 0 && c.SpreadMs <= 1e9):
		return fmt.Errorf("burst: spread %v ms, want in [0, 1e9]", c.SpreadMs)
	case c.OutputTokens < 1:
		return fmt.Errorf("burst: output tokens %d, want >= 1", c.OutputTokens)
	}
	return nil
}

// Bursts generates a burst workload in trace form. The prefix is whole
// trace blocks (PrefixTokens rounded down to TraceBlockSize), so the
// siblings share exactly it. Equal (seeded) configurations give equal
// workloads.
func Bursts(c BurstConfig) ([]Request, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(c.Seed, 0x6275727374))
	next := uint64(0)
	fresh := func() uint64 { next++; return next - 1 }
	prefix := c.PrefixTokens / TraceBlockSize
	out := make([]Request, 0, c.Bursts*c.Siblings)
	t := 0.0
	for range c.Bursts {
		t += r.ExpFloat64() / c.Rate * 1000
		shared := make([]uint64, prefix)
		for i := range shared {
			shared[i] = fresh()
		}
		length := prefix*TraceBlockSize + c.SuffixTokens
		for range c.Siblings {
			ids := append(shared[:prefix:prefix], make([]uint64, (length+TraceBlockSize-1)/TraceBlockSize-prefix)...)
			for i := prefix; i < len(ids); i++ {
				ids[i] = fresh()
			}
			out = append(out, Request{Timestamp: t + r.Float64()*c.SpreadMs, InputLength: length, OutputLength: c.OutputTokens, HashIDs: ids})
		}
	}
	slices.SortStableFunc(out, func(a, b Request) int { return cmp.Compare(a.Timestamp, b.Timestamp) })
	return out, nil
}
