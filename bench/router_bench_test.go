package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
)

// BenchmarkSchedule measures one scheduling decision (Schedule then Free)
// over a fleet whose workers each run 2 requests of 32 blocks, for a
// 32-block request that 8 workers partly cache. ns/candidate is ns/op over
// the number of workers; blocks/s counts the request's blocks scheduled.
func BenchmarkSchedule(b *testing.B) {
	for _, n := range []int{2, 32, 1024, 10000} {
		for _, temp := range []float64{0, 0.7} {
			b.Run(fmt.Sprintf("workers=%d/temp=%v", n, temp), func(b *testing.B) {
				ws := make([]kvevent.Worker, n)
				for i := range ws {
					ws[i] = kvevent.Worker{ID: kvevent.WorkerID(i)}
				}
				s, err := router.NewScheduler(router.SchedulerConfig{BlockSize: 16, OverlapWeight: 1, Temperature: temp, TrackPrefillTokens: true}, ws)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				blocks := func(base uint64) []uint64 {
					out := make([]uint64, 32)
					for i := range out {
						out[i] = base + uint64(i)
					}
					return out
				}
				for i := range 2 * n {
					id := uuid.NewSHA1(uuid.Nil, fmt.Appendf(nil, "bg%d", i))
					if _, err := s.Schedule(ctx, router.SchedRequest{ID: id, ISL: 512, Blocks: blocks(uint64(i%64) << 32)}); err != nil {
						b.Fatal(err)
					}
				}
				ov := map[kvevent.Worker]uint32{}
				for i := range min(8, n) {
					ov[ws[i*n/min(8, n)]] = uint32(4 * (i + 1))
				}
				req := router.SchedRequest{ID: uuid.New(), ISL: 520, Blocks: blocks(5 << 32), Overlaps: ov}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := s.Schedule(ctx, req); err != nil {
						b.Fatal(err)
					}
					if err := s.Free(req.ID); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/candidate")
				b.ReportMetric(float64(len(req.Blocks))*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
			})
		}
	}
}
