package bench

import (
	"testing"

	"github.com/kvradix/kvradix/replay"
	"github.com/kvradix/kvradix/trace"
)

// BenchmarkReplay is one replay of the embedded trace (12,031 requests, 16
// engines, the default fleet) through the public entry point, the prompts'
// hashing included: op=run is replay.Run with one router, op=references
// the pooled and unbounded reference caches. requests/s counts the trace's
// requests.
func BenchmarkReplay(b *testing.B) {
	reqs, err := trace.ReadAll(trace.Default())
	if err != nil {
		b.Fatal(err)
	}
	cfg := replay.DefaultConfig()
	for _, name := range []string{replay.RoundRobin, replay.KV} {
		b.Run("op=run/router="+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := replay.Run(reqs, name, cfg); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(reqs))*float64(b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
	b.Run("op=references", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := replay.References(reqs, cfg); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(reqs))*float64(b.N)/b.Elapsed().Seconds(), "requests/s")
	})
}
