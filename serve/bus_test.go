package serve_test

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvradix/kvradix/cluster"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/serve"
)

// onBus starts a replica of the service on the bus at url.
func onBus(t *testing.T, url string) (*serve.Service, *httptest.Server) {
	t.Helper()
	svc, err := serve.NewOnBus(serve.Config{}, serve.BusConfig{URL: url, Discover: 20 * time.Millisecond, SnapshotEvery: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		ts.Close()
		if err := svc.Close(); err != nil {
			t.Error(err)
		}
	})
	return svc, ts
}

// Replicas on one bus serve the same index: an engine registered with one
// is indexed by every replica, one started later included (from the
// snapshots and the stream); a block size other than the model's is a
// conflict on every replica; unregistering it on its replica empties
// them all.
func TestBusReplicas(t *testing.T) {
	srv, err := cluster.StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	a, tsA := onBus(t, srv.URL())
	b, tsB := onBus(t, srv.URL())
	e := newEngine(t, 5)
	e.register(t, a)
	e.publish(t, 30)
	e.caughtUp(t, tsA.URL, "replica a to index the engine registered with it")
	e.caughtUp(t, tsB.URL, "replica b to index the engine registered with a")
	e.publish(t, 10)
	_, tsC := onBus(t, srv.URL())
	e.caughtUp(t, tsC.URL, "replica c, started later, to index the engine")
	if seq := metric(t, tsC.URL, `kvradix_bus_sequence{model="m:default"}`); seq < 80 {
		t.Errorf("replica c stands at %v of the bus, want the 80 events published", seq)
	}

	other := newEngine(t, 6)
	for name, svc := range map[string]*serve.Service{"a": a, "b": b} {
		err := svc.Register(serve.Registration{InstanceID: 6, Endpoint: other.pub.Addr(), ModelName: "m", BlockSize: 2 * bs})
		if !errors.Is(err, serve.ErrConflict) {
			t.Errorf("replica %s took block size %d for model m of block size %d: %v", name, 2*bs, bs, err)
		}
	}

	if err := a.Unregister(serve.Unregistration{InstanceID: 5, ModelName: "m"}); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{tsA.URL, tsB.URL, tsC.URL} {
		testwait.For(t, "every replica to drop the unregistered engine", func() bool { return len(dumpHoldings(t, url)) == 0 })
	}
}

// The streams are bounded when asked (they kept every event for good),
// never below what a replica joining from the latest snapshot needs.
func TestBusStreamsAreBounded(t *testing.T) {
	srv, err := cluster.StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if _, err := serve.NewOnBus(serve.Config{}, serve.BusConfig{URL: srv.URL(), SnapshotEvery: time.Minute, MaxAge: time.Minute}); err == nil {
		t.Fatal("a stream kept one snapshot interval was accepted")
	}
	svc, err := serve.NewOnBus(serve.Config{}, serve.BusConfig{URL: srv.URL(), SnapshotEvery: time.Second, MaxAge: time.Hour, MaxBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	newEngine(t, 5).register(t, svc)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	streams := js.ListStreams(t.Context())
	n := 0
	for info := range streams.Info() {
		if info.Config.Metadata["kvradix_model"] != "m" {
			continue
		}
		n++
		if info.Config.MaxAge != time.Hour || info.Config.MaxBytes != 1<<30 {
			t.Errorf("stream %s keeps %v and %d bytes", info.Config.Name, info.Config.MaxAge, info.Config.MaxBytes)
		}
	}
	if n != 1 {
		t.Fatalf("%d streams of model m", n)
	}
}
