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

// Sweep finds, in one process, the shortest window im keeps up with: from
// the corpus's window it halves the window until a run falls behind, then
// bisects between the last window that kept up and the first that did
// not, in at most steps runs of fresh indexers. It returns the run at the
// shortest window that kept up (or the last run, if none did), with every
// step in its Sweep; each is reported to step as it ends (nil: none). The
// sustained protocol (Sustained) is the field's figure; this is the
// quick look.
func Sweep(c *Corpus, im shardpool.Impl, p Protocol, steps int, stop <-chan struct{}, step func(w time.Duration, r *Result)) *Result {
	var best, last *Result
	var pts []SweepPoint
	lo, hi := time.Duration(0), c.ReferenceWindow // lo fell behind, hi kept up (once found)
	for k := 0; k < steps; k++ {
		w := hi
		if k > 0 {
			if lo == 0 {
				w = hi / 2
			} else {
				w = (lo + hi) / 2
			}
		}
		if w < 10*time.Millisecond || closed(stop) {
			break
		}
		r := RunFresh(c.Rescaled(w), im, p, stop)
		pts = append(pts, SweepPoint{WindowMs: w.Seconds() * 1e3, OfferedBlockOpsPerSec: r.OfferedBlockOpsPerSec,
			AchievedBlockOpsPerSec: r.AchievedBlockOpsPerSec, QueryServiceP99Ns: r.QueryService.P99, KeptUp: r.KeptUp, GeneratorValid: r.GeneratorValid})
		if step != nil {
			step(w, r)
		}
		last = r
		if r.KeptUp {
			best, hi = r, w
		} else if lo = w; best == nil {
			break // the longest window already fell behind
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
