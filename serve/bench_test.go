package serve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/serve"
)

// BenchmarkQueryByHash is /query_by_hash of 64 block hashes over HTTP
// (keep-alive connections, GOMAXPROCS×4 clients on the same cores as the
// server), against an index where 16 instances hold a 64-block prefix;
// requests/s is the figure the issue's ≥ 10k target reads.
func BenchmarkQueryByHash(b *testing.B) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	idx := serve.IndexForTest(svc, "m", 16)
	hashes := make([]uint64, 64)
	for i := range hashes {
		hashes[i] = uint64(i+1) * 0x9E3779B97F4A7C15
	}
	for w := range 16 {
		st := kvevent.Stored{}
		for i, h := range hashes {
			st.Blocks = append(st.Blocks, kvevent.StoredBlock{BlockHash: uint64(w)<<32 | uint64(i), TokensHash: h})
		}
		if err := idx.ApplyEvent(kvevent.RouterEvent{WorkerID: kvevent.WorkerID(w), Event: kvevent.Event{Data: st}}); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := idx.Flush(); err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	body, _ := json.Marshal(serve.HashQuery{BlockHashes: hashes, ModelName: "m"})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(ts.URL+"/query_by_hash", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
}

// filledService is a service on dir with one index of about 1M
// (instance, block) pairs: 16 workers of 256 chains of 256 blocks.
func filledService(b *testing.B, dir string) (*serve.Service, int) {
	svc := serve.New(serve.Config{StateDir: dir})
	idx := serve.IndexForTest(svc, "m", 16)
	pairs := 0
	for w := range 16 {
		for c := range 256 {
			st := kvevent.Stored{Blocks: make([]kvevent.StoredBlock, 256)}
			for i := range st.Blocks {
				st.Blocks[i] = kvevent.StoredBlock{BlockHash: uint64(w)<<40 | uint64(c)<<20 | uint64(i), TokensHash: uint64(c)<<20 | uint64(i) + 1}
			}
			if err := idx.ApplyEvent(kvevent.RouterEvent{WorkerID: kvevent.WorkerID(w), Event: kvevent.Event{Data: st}}); err != nil {
				b.Fatal(err)
			}
			pairs += 256
		}
	}
	if _, err := idx.Flush(); err != nil {
		b.Fatal(err)
	}
	return svc, pairs
}

// BenchmarkRecover is a restart with a state directory: an index of about
// 1M (instance, block) pairs saved by Close, then recovered by a new
// service (read, checked, applied, flushed). The target: within 1 s.
func BenchmarkRecover(b *testing.B) {
	dir := b.TempDir()
	svc, pairs := filledService(b, dir)
	if err := svc.Close(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		again := serve.New(serve.Config{StateDir: dir})
		rec, err := again.Recover()
		if err != nil || rec.Pairs != pairs {
			b.Fatalf("recovered %+v (%v), want %d pairs", rec, err, pairs)
		}
		b.StopTimer()
		again.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(pairs), "pairs")
}

// BenchmarkSave is a save while serving of an index of about 1M pairs
// (encoded, checksummed, written and fsynced): how long the engines'
// subscribers stay paused.
func BenchmarkSave(b *testing.B) {
	svc, pairs := filledService(b, b.TempDir())
	defer svc.Close()
	for b.Loop() {
		if err := svc.Save(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(pairs), "pairs")
}
