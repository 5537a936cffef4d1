package serve_test

import (
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/serve"
)

// silentEngine accepts TCP connections and never says a word.
func silentEngine(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { io.Copy(io.Discard, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "tcp://" + ln.Addr().String()
}

// Engines whose endpoints never answer are dialled with no lock held: a
// good engine registers at once while three dead ones are being dialled
// (it waited for each dead one's handshake timeout in turn), and Close
// abandons their dials instead of waiting them out.
func TestDeadEnginesDelayNobody(t *testing.T) {
	cfg := serve.Config{}
	cfg.Subscriber.HandshakeTimeout = time.Minute
	svc := serve.New(cfg)
	var dead sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		dead.Go(func() {
			errs <- svc.Register(serve.Registration{InstanceID: uint64(100 + i), Endpoint: silentEngine(t), ModelName: "m", BlockSize: bs})
		})
	}
	testwait.For(t, "three dead engines to be dialled", func() bool { return serve.PendingForTest(svc) == 3 })

	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	start := time.Now()
	if err := svc.Register(serve.Registration{InstanceID: 1, Endpoint: pub.Addr(), ModelName: "m", BlockSize: bs}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("a good registration took %v behind three dead ones", took)
	}
	if ws := svc.Workers(); len(ws) != 1 || ws[0].InstanceID != 1 {
		t.Fatalf("workers: %+v", ws)
	}

	start = time.Now()
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("Close took %v with three dials in progress", took)
	}
	dead.Wait()
	close(errs)
	for err := range errs {
		if err == nil {
			t.Error("a dead engine's registration succeeded")
		}
	}
}

// Out-of-range settings are floored or capped, not obeyed: a nanosecond
// TTL panicked (a ticker of 0; the expiry goroutine makes it before Close
// returns), a nanosecond save interval saved continually.
func TestConfigOutOfRange(t *testing.T) {
	svc := serve.New(serve.Config{RequestTTL: time.Nanosecond, SaveEvery: time.Nanosecond, StateDir: t.TempDir(), Lanes: 1 << 20, MaxBodyBytes: -1})
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
}

// Engines as they send today, through the service: vLLM's main branch
// (a map envelope around tagged-map events) and SGLang's salted stores (a
// metadata map where vLLM's lora_name sits) are indexed; a salted block
// matches a query with its salt and not plain text.
func TestEnginesOfToday(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	prompt := tokens(2*bs, 500)
	for _, tc := range []struct {
		name string
		id   uint64
		enc  vllm.Encoding
		salt string
	}{
		{"vllm-main", 1, vllm.MapEnvelopeEncoding, ""},
		{"sglang-salted", 2, vllm.ArrayEncoding, "tenant-secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m", Encoding: tc.enc})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			model := "m-" + tc.name
			if err := svc.Register(serve.Registration{InstanceID: tc.id, Endpoint: pub.Addr(), ModelName: model, BlockSize: bs}); err != nil {
				t.Fatal(err)
			}
			stored := vllm.Event{Type: vllm.BlockStored, BlockHashes: []uint64{71, 72}, TokenIDs: prompt, BlockSize: bs, Medium: "GPU", CacheSalt: tc.salt}
			testwait.For(t, "the engine's blocks to be indexed", func() bool {
				if _, err := pub.Publish([]vllm.Event{stored}); err != nil {
					t.Fatal(err)
				}
				var got serve.Scores
				post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: model, CacheSalt: tc.salt}, &got)
				return got.Scores[fmt.Sprint(tc.id)]["0"] == 2*bs
			})
			// An event of another block size is refused, and counted by
			// reason.
			foreign := vllm.Event{Type: vllm.BlockStored, BlockHashes: []uint64{81}, TokenIDs: prompt, BlockSize: 2 * bs, Medium: "GPU"}
			if _, err := pub.Publish([]vllm.Event{foreign}); err != nil {
				t.Fatal(err)
			}
			sample := fmt.Sprintf(`kvradix_subscriber_events_refused_total{dp_rank="0",instance="%d",reason="block_size"}`, tc.id)
			testwait.For(t, "the foreign block size counted", func() bool { return metric(t, ts.URL, sample) == 1 })
			if tc.salt != "" {
				var plain serve.Scores
				post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: model}, &plain)
				if len(plain.Scores) != 0 {
					t.Fatalf("a salted block matched plain text: %v", plain.Scores)
				}
			}
		})
	}
}

// An engine registered as rank 3 whose batches name no rank is rank 3
// (it landed on rank 0), and unregistering it removes every rank its
// batches wrote (one that named rank 5 kept scoring there), but not a rank
// another engine of the instance is registered as.
func TestRanksOfAnEngine(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	prompt := tokens(bs, 900)
	publish := func(rank *int, registerAs int) *vllm.Publisher {
		pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m", DPRank: rank})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		if err := svc.Register(serve.Registration{InstanceID: 4, Endpoint: pub.Addr(), ModelName: "m", BlockSize: bs, DPRank: registerAs}); err != nil {
			t.Fatal(err)
		}
		return pub
	}
	scores := func() map[string]uint64 {
		var got serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
		return got.Scores["4"]
	}
	stored := func(h uint64) []vllm.Event {
		return []vllm.Event{{Type: vllm.BlockStored, BlockHashes: []uint64{h}, TokenIDs: prompt, BlockSize: bs, Medium: "GPU"}}
	}
	silent := publish(nil, 3) // names no rank: rank 3
	five := 5                 // registered as 6, names 5
	misnamed := publish(&five, 6)
	zero := 0
	other := publish(&zero, 0) // rank 0, registered as such
	testwait.For(t, "the three engines' blocks", func() bool {
		silent.Publish(stored(1))
		misnamed.Publish(stored(2))
		other.Publish(stored(3))
		s := scores()
		return s["3"] == bs && s["5"] == bs && s["0"] == bs
	})
	if s := scores(); len(s) != 3 {
		t.Fatalf("scores %v: a rank too many", s)
	}
	for _, rank := range []int{3, 6} {
		r := rank
		if code := post(t, ts.URL+"/unregister", serve.Unregistration{InstanceID: 4, ModelName: "m", DPRank: &r}, nil); code != 200 {
			t.Fatalf("unregister rank %d: %d", rank, code)
		}
	}
	testwait.For(t, "ranks 3 and 5 to leave, rank 0 to stay", func() bool {
		s := scores()
		return len(s) == 1 && s["0"] == bs
	})
}
