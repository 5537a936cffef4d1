package serve

import (
	"maps"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/shardpool"
)

// Routing without events. An engine registered with total_kv_blocks is
// modelled: every request /route sends it takes a lease on its blocks in
// an LRU model of its pool (shardpool.ApproxLRU), released by
// /requests/{id}/complete or the request's expiry. The model's
// predictions are routed on (merged with the events' overlap by max) for
// an engine registered without an endpoint, which publishes no events,
// and for one whose events stopped for longer than
// Config.EventsStaleAfter, until they come again. For an engine whose
// events flow, the model runs beside them and the metrics compare the two
// (kvradix_approx_*_blocks_total): how far its predictions could be
// trusted should the events stop.

// Why an engine is routed on predictions (Worker.Predicted, the metrics'
// reason label).
const (
	predictedEventFree = "event_free" // registered without an endpoint
	predictedStale     = "stale"      // its events stopped (Config.EventsStaleAfter)
)

// predictions is a model's LRU model of the engines registered with
// total_kv_blocks, and with Config.PredictTTL every decision's blocks for
// that long (burst).
type predictions struct {
	approx *shardpool.Approx
	burst  *shardpool.Approx // nil without Config.PredictTTL
	// state is replaced whole (s.mu held) and read without a lock.
	state atomic.Pointer[predictState]
}

// predictState says which (instance, rank)s are modelled, and which of
// them routed on predictions, and why.
type predictState struct {
	modeled map[kvevent.Worker]bool
	routed  map[kvevent.Worker]string
}

func newPredictions(blockSize int, predictTTL time.Duration) *predictions {
	// Every modelled rank gets its own capacity (SetCapacity) before its
	// first prediction; 1 stands for none.
	a, _ := shardpool.NewApprox(shardpool.ApproxConfig{Policy: shardpool.ApproxLRU, BlockSize: blockSize, Capacity: 1})
	p := &predictions{approx: a}
	if predictTTL > 0 {
		p.burst, _ = shardpool.NewApprox(shardpool.ApproxConfig{Policy: shardpool.ApproxTTL, BlockSize: blockSize, TTL: predictTTL})
	}
	p.state.Store(&predictState{modeled: map[kvevent.Worker]bool{}, routed: map[kvevent.Worker]string{}})
	return p
}

// close stops both models.
func (p *predictions) close() {
	_ = p.approx.Close()
	if p.burst != nil {
		_ = p.burst.Close()
	}
}

// change replaces the state with edit's change of a copy (s.mu held).
func (p *predictions) change(edit func(st *predictState)) {
	old := p.state.Load()
	st := &predictState{modeled: maps.Clone(old.modeled), routed: maps.Clone(old.routed)}
	edit(st)
	p.state.Store(st)
}

// model starts modelling a registered engine of total blocks (s.mu held):
// routed on predictions at once if it publishes no events.
func (p *predictions) model(w kvevent.Worker, blocks int, eventFree bool) error {
	if err := p.approx.SetCapacity(w, blocks); err != nil {
		return err
	}
	p.change(func(st *predictState) {
		st.modeled[w] = true
		if eventFree {
			st.routed[w] = predictedEventFree
		}
	})
	return nil
}

// forget stops modelling an engine that left (s.mu held).
func (p *predictions) forget(w kvevent.Worker) {
	if p.burst != nil {
		_ = p.burst.Forget(w)
	}
	if !p.state.Load().modeled[w] {
		return
	}
	_ = p.approx.Forget(w)
	p.change(func(st *predictState) {
		delete(st.modeled, w)
		delete(st.routed, w)
	})
}

// abandon undoes the prediction of a route dropped as its instance left
// (s.mu held): its lease goes, and so does what it predicted of an engine
// no longer modelled (the instance's forget may have come before it).
func (p *predictions) abandon(key uuid.UUID, w kvevent.Worker) {
	_, _ = p.approx.Release(key)
	if !p.state.Load().modeled[w] {
		_ = p.approx.Forget(w)
	}
	if p.burst != nil {
		_ = p.burst.Forget(w)
	}
}

// stale marks an engine with events as routed on predictions or not
// (s.mu held); a no-op when nothing changes.
func (p *predictions) stale(w kvevent.Worker, stale bool) {
	st := p.state.Load()
	if !st.modeled[w] || (st.routed[w] == predictedStale) == stale || st.routed[w] == predictedEventFree {
		return
	}
	p.change(func(st *predictState) {
		if stale {
			st.routed[w] = predictedStale
		} else {
			delete(st.routed, w)
		}
	})
}

// match is the model's overlaps: the index's, and where they are greater
// the predictions of the engines routed on them and, for a route, the
// decisions of the last Config.PredictTTL (a query answers what engines
// hold, not what they are computing). predicted holds every modelled
// engine's prediction (nil if none is modelled), events the index's own
// overlaps.
func (idx *index) match(local []uint64, route bool) (res radix.OverlapScores, predicted, events map[kvevent.Worker]uint32, st *predictState, err error) {
	res, err = idx.pool.FindMatches(local)
	st = idx.pred.state.Load()
	burst := idx.pred.burst
	if !route {
		burst = nil
	}
	if err != nil || len(st.modeled) == 0 && burst == nil {
		return res, nil, res.Scores, st, err
	}
	events = maps.Clone(res.Scores)
	if res.Scores == nil {
		res.Scores = map[kvevent.Worker]uint32{}
	}
	if len(st.modeled) > 0 {
		p, err := idx.pred.approx.FindMatches(local)
		if err != nil {
			return res, nil, events, st, err
		}
		predicted = p.Scores
		for w := range st.routed {
			res.Scores[w] = max(res.Scores[w], predicted[w])
		}
	}
	if burst != nil {
		b, err := burst.FindMatches(local)
		if err != nil {
			return res, predicted, events, st, err
		}
		for w, n := range b.Scores {
			res.Scores[w] = max(res.Scores[w], n)
		}
	}
	return res, predicted, events, st, nil
}

// predict leases a routed request's blocks in its engine's model, if the
// engine is modelled, and, where the engine's events flow, counts how the
// prediction compared with them (events: the index's overlap there).
func (s *Service) predict(k modelKey, idx *index, st *predictState, key uuid.UUID, w kvevent.Worker, local, seq []uint64, isl int, predicted, events uint32) error {
	if b := idx.pred.burst; b != nil {
		if err := b.Predict(key, w, local, seq, 0); err != nil {
			return err
		}
	}
	if !st.modeled[w] {
		return nil
	}
	if st.routed[w] == "" {
		s.metrics.observePrediction(k.String(), predicted, events)
	}
	// The request's output is not known: one block past its prompt's
	// complete ones stands for it (and its partial last block).
	extra := router.BlocksFor(isl, 1, idx.blockSize) - len(local)
	return idx.pred.approx.Predict(key, w, local, seq, extra)
}

// checkStale routes on predictions the modelled engines whose last
// message came longer than Config.EventsStaleAfter ago, and on events
// again those that spoke since (s.mu held). An engine never heard from
// counts from its registration.
func (s *Service) checkStale(now time.Time) {
	if s.cfg.EventsStaleAfter <= 0 {
		return
	}
	for k, inst := range s.instances {
		idx := s.indexes[k.modelKey]
		if inst.sub == nil || idx == nil {
			continue
		}
		last := inst.since
		for _, es := range inst.sub.States() {
			if es.LastMessage.After(last) {
				last = es.LastMessage
			}
		}
		idx.pred.stale(k.worker(), now.Sub(last) > s.cfg.EventsStaleAfter)
	}
}
