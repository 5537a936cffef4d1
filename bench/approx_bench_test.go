package bench

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/shardpool"
)

// approxWorkload is the whole embedded trace on 16 workers of 2,048
// blocks: pools that fill and evict, as a router's index lives.
var approxWorkload = &workload{workers: 16, blocks: 2048}

// BenchmarkApproxCost is what routing without events costs the index, per
// block, over the whole trace on 16 workers of 2,048 blocks (pools that
// fill and evict):
//
//   - kind=predict: an ApproxLRU index of each engine's true capacity fed
//     each request's routing (Predict, to the worker the workload chose)
//     and, 64 requests later, its completion (Release); ns/block per
//     routed block.
//   - kind=events: a CompressedTree fed the engines' Stored and Removed
//     events of the same workload, the event-driven index's writes;
//     ns/block per block stored or removed, ns/stored-block per block
//     stored (its store and, later, its removal).
//
// Both are a block's whole life in its index: made, found again, dropped.
// The target: predict's ns/block at most twice an event-driven
// store. Run each
// kind in a process of its own (-bench 'ApproxCost/kind=predict'): a kind
// run after the other finds the heap grown.
func BenchmarkApproxCost(b *testing.B) {
	ops := approxWorkload.get(b)
	type routed struct {
		w          kvevent.Worker
		local, seq []uint64
	}
	var reqs []routed
	var events []kvevent.RouterEvent
	routedBlocks, eventBlocks, storedBlocks := 0, 0, 0
	for i := range ops {
		op := &ops[i]
		if op.Match != nil {
			reqs = append(reqs, routed{kvevent.Worker{ID: op.Worker}, op.Match, hashing.SequenceHashes(nil, op.Match)})
			routedBlocks += len(op.Match)
			continue
		}
		ev := kvevent.RouterEvent{WorkerID: op.Worker, Event: op.Event}
		events = append(events, ev)
		eventBlocks += ev.Blocks()
		if _, ok := ev.Event.Data.(kvevent.Stored); ok {
			storedBlocks += ev.Blocks()
		}
	}
	ids := make([]uuid.UUID, len(reqs))
	for i := range ids {
		binary.BigEndian.PutUint64(ids[i][8:], uint64(i)+1)
	}
	const inFlight = 64
	b.Run("kind=predict", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			a, err := shardpool.NewApprox(shardpool.ApproxConfig{Policy: shardpool.ApproxLRU, BlockSize: 64, Capacity: 2048})
			if err != nil {
				b.Fatal(err)
			}
			for i, r := range reqs {
				if err := a.Predict(ids[i], r.w, r.local, r.seq, 1); err != nil {
					b.Fatal(err)
				}
				if i >= inFlight {
					_, _ = a.Release(ids[i-inFlight])
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(routedBlocks), "ns/block")
	})
	b.Run("kind=events", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			t := radix.NewCompressedTree()
			for _, ev := range events {
				_ = t.Apply(ev)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(eventBlocks), "ns/block")
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(storedBlocks), "ns/stored-block")
	})
}

// BenchmarkRouteDecision is one routing decision, on the caller's
// goroutine, for the trace workload's requests (2,000 over 100 workers of
// 4,096 blocks, block size 64), each completed 64 requests later: kv with
// no events (its index empty: the scheduler and an empty lookup), against
// the approximate modes, whose decision also looks the prediction up and
// makes it.
func BenchmarkRouteDecision(b *testing.B) {
	ops := traceWorkload.get(b)
	var reqs []router.Request
	for i := range ops {
		if m := ops[i].Match; m != nil {
			reqs = append(reqs, router.Request{Local: m, PromptTokens: len(m) * 64, MaxOutputTokens: 1})
		}
	}
	for _, mode := range []router.Mode{router.KV, router.KVApproxLRU, router.KVApproxTTL, router.KVPredict} {
		b.Run("mode="+mode.String(), func(b *testing.B) {
			cfg := router.DefaultConfig()
			cfg.BlockSize, cfg.ApproxCapacity, cfg.IndexerLanes = 64, 4096, 1
			r, err := router.New(mode, cfg, 100)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Shutdown()
			ctx := context.Background()
			var inFlight []uuid.UUID
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req := reqs[i%len(reqs)]
				req.UUID = uuid.New()
				i++
				if _, err := r.SelectWorker(ctx, req); err != nil {
					b.Fatal(err)
				}
				if inFlight = append(inFlight, req.UUID); len(inFlight) > 64 {
					if _, err := r.OnComplete(inFlight[0]); err != nil {
						b.Fatal(err)
					}
					inFlight = inFlight[1:]
				}
			}
		})
	}
}
