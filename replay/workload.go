package replay

import (
	"context"
	"errors"
	"math/rand/v2"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/trace"
)

// Op is one operation of an indexer workload: a worker's KV event, or a
// request's overlap match (Match holds its local block hashes).
type Op struct {
	T      float64 // virtual ms
	Worker kvevent.WorkerID
	Event  kvevent.Event
	Match  []uint64
}

// Blocks returns the blocks the op touches: an event's blocks, or the
// request's blocks for a match.
func (o *Op) Blocks() int {
	if o.Match != nil {
		return len(o.Match)
	}
	ev := kvevent.RouterEvent{Event: o.Event}
	return ev.Blocks()
}

// Workload spreads reqs over cfg.Workers × cfg.DPSize simulated engines (uniformly at
// random, seeded by cfg.Seed), runs each worker's requests through its mock
// engine on the virtual clock, and returns the timeline of what an indexer
// sees: every engine's KV events and, at each request's arrival, the match
// of its blocks. Ops are in time order.
func Workload(reqs []trace.Request, cfg Config) ([]Op, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := startPrompts(context.Background(), reqs, cfg)
	defer p.close()
	rec := &recorder{rng: rand.New(rand.NewPCG(cfg.Seed, 0x776f726b)), cfg: cfg}
	var res Result
	if _, err := simulate(context.Background(), reqs, p, cfg, rec, &res); err != nil {
		return nil, err
	}
	if res.UnpublishedEvts > 0 {
		return nil, errors.New("replay: events lost while recording")
	}
	return rec.ops, nil
}

// recorder is the policy that builds a workload.
type recorder struct {
	rng   *rand.Rand
	cfg   Config
	clock *float64 // the simulation's virtual time
	ops   []Op
}

func (r *recorder) setClock(now *float64) { r.clock = now }

func (r *recorder) predicted() (uint32, bool) { return 0, false }

func (r *recorder) choose(i int, _ router.Request, local []uint64) (int, error) {
	w := r.rng.IntN(r.cfg.engines())
	worker, _ := r.cfg.engineOf(w)
	r.ops = append(r.ops, Op{T: r.now(), Worker: worker, Match: append([]uint64{}, local...)})
	return w, nil
}

func (r *recorder) now() float64 {
	return *r.clock
}

type recordingSink struct {
	r *recorder
	w kvevent.WorkerID
}

func (s recordingSink) Publish(ev kvevent.Event) error {
	s.r.ops = append(s.r.ops, Op{T: s.r.now(), Worker: s.w, Event: ev})
	return nil
}

func (s recordingSink) PublishWithTier(ev kvevent.Event, _ kvevent.Tier) error { return s.Publish(ev) }

func (r *recorder) sink(w kvevent.WorkerID) router.EventSink { return recordingSink{r, w} }
func (r *recorder) firstToken(uuid.UUID) error               { return nil }
func (r *recorder) complete(uuid.UUID) error                 { return nil }
