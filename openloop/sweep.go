package openloop

import (
	"time"

	"github.com/kvradix/kvradix/shardpool"
)

// SweepPoint is one window a sweep tried.
type SweepPoint struct {
	WindowMs               float64 `json:"window_ms"`
	OfferedBlockOpsPerSec  float64 `json:"offered_block_ops_per_sec"`
	AchievedBlockOpsPerSec float64 `json:"achieved_block_ops_per_sec"`
	QueryServiceP99Ns      uint64  `json:"query_service_p99_ns"`
	KeptUp                 bool    `json:"kept_up"`
	GeneratorValid         bool    `json:"generator_valid"`
}

// Sweep finds, in one process, the shortest window im keeps up with, its
// generator valid: from the corpus's window it halves the window while
// runs pass (or doubles it while they fail, up to 16 times the first),
// then bisects between the shortest window that passed and the longest
// that failed, in at most steps runs of fresh indexers. It returns the run
// at the shortest passing window (or the last run, if none passed), with
// every step in its Sweep; each is reported to step as it ends (nil:
// none). The sustained protocol (FindSustained) is the field's figure;
// this is the quick look.
func Sweep(c *Corpus, im shardpool.Impl, p Protocol, steps int, stop <-chan struct{}, step func(w time.Duration, r *Result)) *Result {
	var best, last *Result
	var pts []SweepPoint
	longest := 16 * c.ReferenceWindow
	fail, pass := time.Duration(0), time.Duration(0) // the longest window that failed, the shortest that passed
	for w, k := c.ReferenceWindow, 0; k < steps && w >= 10*time.Millisecond && w <= longest && !closed(stop); k++ {
		r := RunFresh(c.Rescaled(w), im, p, stop)
		pts = append(pts, SweepPoint{WindowMs: w.Seconds() * 1e3, OfferedBlockOpsPerSec: r.OfferedBlockOpsPerSec,
			AchievedBlockOpsPerSec: r.AchievedBlockOpsPerSec, QueryServiceP99Ns: r.QueryService.P99, KeptUp: r.KeptUp, GeneratorValid: r.GeneratorValid})
		if step != nil {
			step(w, r)
		}
		last = r
		if r.KeptUp && r.GeneratorValid {
			best, pass = r, w
		} else {
			fail = w
		}
		switch {
		case pass == 0:
			w *= 2
		case fail == 0:
			w /= 2
		default:
			w = (fail + pass) / 2
		}
	}
	res := last
	if best != nil {
		res = best
	}
	if res != nil {
		res.Sweep = pts
	}
	return res
}
