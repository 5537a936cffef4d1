package vllm

import (
	"fmt"
	"testing"
)

// BenchmarkDecodeBatch decodes batches of 8 BlockStored events of 64
// blocks of 16 tokens, in both encodings; events/s counts events.
func BenchmarkDecodeBatch(b *testing.B) {
	g := NewSynthEngine(1, 16, 64, 0)
	batch := Batch{DPRank: ptr(0)}
	for range 8 {
		batch.Events = append(batch.Events, g.Step())
	}
	for _, enc := range []Encoding{ArrayEncoding, MapEncoding} {
		payload := AppendBatch(nil, &batch, enc)
		b.Run(fmt.Sprintf("enc=%v/blocks=64", enc), func(b *testing.B) {
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeBatch(payload); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(8*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
	conv := NewConverter(1, 16)
	b.Run("op=convert/blocks=64", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = conv.Convert(nil, &batch)
		}
		b.ReportMetric(8*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}
