package openloop

import (
	"testing"
	"time"

	"github.com/kvradix/kvradix/shardpool"
)

// Memory over time: evenly spaced samples ending at the last operation,
// the model's memberships equal to the pairs every exact indexer says it
// holds, and bytes per membership in a sane range (a pair costs bytes,
// but not kilobytes).
func TestMeasureMemory(t *testing.T) {
	c := smallCorpus(t, 2, 2, time.Second)
	for _, im := range []shardpool.Impl{{Name: "single", Lanes: 1}, {Name: "pool", Lanes: 2}, {Name: "compressed", Lanes: 2}} {
		rep := MeasureMemory(c, im, MemoryConfig{Samples: 10})
		if len(rep.Samples) != 10 || rep.Samples[9].At != len(c.Ops) || rep.Entries != len(c.Ops) || rep.TraceDuplicationFactor != 2 {
			t.Fatalf("%v: %+v", im, rep)
		}
		for i, s := range rep.Samples {
			if s.Memberships != s.IndexPairs {
				t.Fatalf("%v sample %d: the model holds %d memberships, the index %d pairs", im, i, s.Memberships, s.IndexPairs)
			}
			if i > 0 && s.At <= rep.Samples[i-1].At {
				t.Fatalf("%v: samples at %d then %d", im, rep.Samples[i-1].At, s.At)
			}
		}
		if b := rep.TimeAvgBytesPerMembership; !(b > 4 && b < 2000) || rep.PeakBackendBytes <= 0 || rep.MeanMemberships <= 0 ||
			rep.MaxBytesPerMembership < b || rep.Samples[9].Events+rep.Samples[9].Queries != len(c.Ops) {
			t.Fatalf("%v: %+v", im, rep)
		}
	}
	if got := samplePoints(5, 100); len(got) != 5 || got[4] != 5 {
		t.Fatalf("5 operations, 100 samples: %v", got)
	}
}
