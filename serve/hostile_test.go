package serve_test

import (
	"io"
	"net"
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
