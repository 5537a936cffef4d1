package cluster_test

import (
	"fmt"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix/radixtest"
	"github.com/kvradix/kvradix/shardpool"
)

// BenchmarkRestore is a new replica's start from a snapshot of about
// pairs (worker, block) pairs: read, decode, apply, flush.
func BenchmarkRestore(b *testing.B) {
	for _, pairs := range []int{250_000, 1_000_000} {
		b.Run(fmt.Sprintf("pairs=%d", pairs), func(b *testing.B) {
			ctx, _, bus := setup(b)
			pool := shardpool.NewPool(2, 16)
			defer pool.Close()
			r, err := bus.Follow(ctx, pool, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			for w := range 16 {
				for c := range pairs / 16 / 64 {
					blocks := make([]uint64, 0, 128)
					for k := range 64 {
						blocks = append(blocks, uint64(w)<<40|uint64(c)<<20|uint64(k)+1, uint64(c)<<20|uint64(k)+1)
					}
					_ = pool.ApplyEvent(radixtest.Stored(kvevent.Worker{ID: kvevent.WorkerID(w)}, -1, blocks...))
				}
			}
			if _, err := pool.Flush(); err != nil {
				b.Fatal(err)
			}
			if _, err := r.Snapshot(ctx, pool.Index()); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				fresh := shardpool.NewPool(2, 16)
				if _, err := bus.Restore(ctx, fresh); err != nil {
					b.Fatal(err)
				}
				fresh.Close()
			}
			b.ReportMetric(float64(pool.Index().Size()), "pairs")
		})
	}
}
