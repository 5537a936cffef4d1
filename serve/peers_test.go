package serve_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix/holdings"
	"github.com/kvradix/kvradix/serve"
)

// A service started empty with peers restores its indexes from the first
// peer whose /dump reads whole: peers that fail, answer a bare list (an
// older peer, no block size) or cut the dump midway are passed over and
// leave nothing behind; the restored index equals the peer's, and the
// service is ready after.
func TestRecoverFromPeers(t *testing.T) {
	e := newEngine(t, 7)
	a := serve.New(serve.Config{})
	defer a.Close()
	tsA := httptest.NewServer(a.Handler())
	defer tsA.Close()
	e.register(t, a)
	e.publish(t, 20)
	e.caughtUp(t, tsA.URL, "the peer indexing the engine")

	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down for maintenance", http.StatusInternalServerError)
	}))
	defer broken.Close()
	older := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"m:default": [{"event_id": 1, "worker_id": 7, "data": {"cleared": null}}]}`))
	}))
	defer older.Close()
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.Get(tsA.URL + "/dump")
		if err != nil {
			return
		}
		defer resp.Body.Close()
		b := make([]byte, 300)
		n, _ := resp.Body.Read(b)
		w.Write(b[:n])
	}))
	defer cut.Close()

	b := serve.New(serve.Config{Peers: []string{broken.URL, older.URL, cut.URL, tsA.URL + "/"}})
	defer b.Close()
	tsB := httptest.NewServer(b.Handler())
	defer tsB.Close()
	if ok, _ := b.Ready(); ok {
		t.Fatal("ready before recovering from its peers")
	}
	rec, err := b.Recover()
	if err != nil || rec.Peer != tsA.URL || rec.PeerEvents == 0 || len(rec.Failed) != 0 {
		t.Fatalf("recovered %+v (%v)", rec, err)
	}
	if ok, why := b.Ready(); !ok {
		t.Fatalf("not ready after recovering: %s", why)
	}
	if d := dumpHoldings(t, tsB.URL).Diff(dumpHoldings(t, tsA.URL)); d != "" {
		t.Fatalf("the restored index differs from the peer's: %s", d)
	}

	// No peer reads whole: the service starts empty, saying why.
	c := serve.New(serve.Config{Peers: []string{broken.URL, older.URL, cut.URL}})
	defer c.Close()
	rec, err = c.Recover()
	if err != nil || rec.Peer != "" || len(rec.Failed) != 1 {
		t.Fatalf("recovered %+v (%v)", rec, err)
	}
	for _, says := range []string{"500", "older peer", broken.URL, cut.URL} {
		if !strings.Contains(rec.Failed[0], says) {
			t.Errorf("the failure does not say %q: %s", says, rec.Failed[0])
		}
	}
	tsC := httptest.NewServer(c.Handler())
	defer tsC.Close()
	var dump serve.Dump
	if get(t, tsC.URL+"/dump", &dump); len(dump) != 0 {
		t.Fatalf("a failed recovery left %v", dump)
	}

	// A peer's dump makes no more indexes than the service may hold.
	many := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"m1:default": {"block_size": 16, "events": []}, "m2:default": {"block_size": 16, "events": []}, "m3:default": {"block_size": 16, "events": []}}`))
	}))
	defer many.Close()
	d := serve.New(serve.Config{Peers: []string{many.URL}, MaxIndexes: 2})
	defer d.Close()
	if rec, err = d.Recover(); err != nil || rec.Peer != "" || len(rec.Failed) != 1 || !strings.Contains(rec.Failed[0], "more than 2 indexes") {
		t.Fatalf("a dump of 3 indexes into a service of 2: %+v (%v)", rec, err)
	}
}

// A dump is written whole however long it takes past the server's write
// timeout, which ran from the request's arrival through the dump's making:
// big dumps were cut midway, and a peer recovering from one failed.
func TestDumpOutlivesWriteTimeout(t *testing.T) {
	const events, chain = 500, 500 // a quarter of a million pairs
	want := holdings.Set{}
	body := []byte(`{"m:default":{"block_size":16,"events":[`)
	for i := range events {
		st := kvevent.Stored{Blocks: make([]kvevent.StoredBlock, chain)}
		for j := range st.Blocks {
			h := uint64(i*chain + j + 1)
			st.Blocks[j] = kvevent.StoredBlock{BlockHash: h, TokensHash: h}
		}
		ev := kvevent.RouterEvent{WorkerID: 1, Event: kvevent.Event{ID: uint64(i), Data: st}}
		_ = want.Apply(ev)
		if i > 0 {
			body = append(body, ',')
		}
		body = ev.AppendJSON(body)
	}
	body = append(body, "]}}"...)
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }))
	defer peer.Close()
	svc := serve.New(serve.Config{Peers: []string{peer.URL}})
	defer svc.Close()
	if rec, err := svc.Recover(); err != nil || rec.PeerEvents != events {
		t.Fatalf("recovered %+v (%v)", rec, err)
	}
	ts := httptest.NewUnstartedServer(svc.Handler())
	ts.Config.WriteTimeout = 10 * time.Millisecond // less than making this dump takes
	ts.Start()
	defer ts.Close()
	if d := dumpHoldings(t, ts.URL).Diff(want); d != "" {
		t.Fatalf("the dump differs from what the peer gave: %s", d)
	}
}

// With HoldWhileRecovering, until Recover has run, what would change the
// state and /dump answer 503 while queries answer; Recover ending, here
// abandoned by its context, lets them through. Without it (the library's
// default), nothing is held.
func TestHoldWhileRecovering(t *testing.T) {
	hung, err := net.Listen("tcp", "127.0.0.1:0") // a peer that never answers
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	peers := []string{"http://" + hung.Addr().String()}
	reg := serve.Registration{InstanceID: 1, ModelName: "m", BlockSize: bs, TotalKVBlocks: 64}
	status := func(ts *httptest.Server, method, path string, body any) int {
		t.Helper()
		if method == http.MethodPost {
			return post(t, ts.URL+path, body, nil)
		}
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	held := serve.New(serve.Config{Peers: peers, HoldWhileRecovering: true})
	defer held.Close()
	ts := httptest.NewServer(held.Handler())
	defer ts.Close()
	for _, tc := range []struct {
		method, path string
		body         any
		want         int
	}{
		{"POST", "/register", reg, http.StatusServiceUnavailable},
		{"POST", "/register_peer", serve.Peer{URL: "http://b:1"}, http.StatusServiceUnavailable},
		{"POST", "/route", serve.RouteRequest{TokenIDs: tokens(bs, 1), ModelName: "m"}, http.StatusServiceUnavailable},
		{"GET", "/dump", nil, http.StatusServiceUnavailable},
		{"GET", "/ready", nil, http.StatusServiceUnavailable},
		{"POST", "/query", serve.Query{TokenIDs: tokens(bs, 1), ModelName: "m"}, http.StatusNotFound}, // answered: no such model yet
	} {
		if got := status(ts, tc.method, tc.path, tc.body); got != tc.want {
			t.Errorf("%s %s while recovering: %d, want %d", tc.method, tc.path, got, tc.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if rec, err := held.RecoverContext(ctx); err != nil || len(rec.Failed) != 1 {
		t.Fatalf("an abandoned recovery: %+v (%v)", rec, err)
	}
	if got := status(ts, "POST", "/register", reg); got != http.StatusCreated {
		t.Fatalf("a registration once recovered: %d", got)
	}

	open := serve.New(serve.Config{Peers: peers})
	defer open.Close()
	ts2 := httptest.NewServer(open.Handler())
	defer ts2.Close()
	if got := status(ts2, "POST", "/register", reg); got != http.StatusCreated {
		t.Fatalf("a registration held without HoldWhileRecovering: %d", got)
	}
}

// Peers are registered, listed and deregistered over HTTP, as Dynamo's
// standalone indexer has them.
func TestPeerEndpoints(t *testing.T) {
	svc := serve.New(serve.Config{Peers: []string{"http://a:8090"}})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	var st map[string]string
	if code := post(t, ts.URL+"/register_peer", serve.Peer{URL: "http://b:8090/"}, &st); code != http.StatusCreated || st["status"] != "ok" {
		t.Fatalf("register_peer: %d %v", code, st)
	}
	post(t, ts.URL+"/register_peer", serve.Peer{URL: "http://b:8090"}, nil) // once only
	var peers []string
	if get(t, ts.URL+"/peers", &peers); !reflect.DeepEqual(peers, []string{"http://a:8090", "http://b:8090"}) {
		t.Fatalf("peers %v", peers)
	}
	if code := post(t, ts.URL+"/register_peer", serve.Peer{URL: "ftp://c"}, &st); code != http.StatusBadRequest {
		t.Fatalf("an ftp peer: %d", code)
	}
	if code := post(t, ts.URL+"/deregister_peer", serve.Peer{URL: "http://a:8090"}, nil); code != http.StatusOK {
		t.Fatalf("deregister_peer: %d", code)
	}
	if code := post(t, ts.URL+"/deregister_peer", serve.Peer{URL: "http://a:8090"}, &st); code != http.StatusNotFound || st["error"] != "peer not found" {
		t.Fatalf("deregistering it again: %d %v", code, st)
	}
	if get(t, ts.URL+"/peers", &peers); !reflect.DeepEqual(peers, []string{"http://b:8090"}) {
		t.Fatalf("peers %v", peers)
	}
	post(t, ts.URL+"/deregister_peer", serve.Peer{URL: "http://b:8090"}, nil)
	fresh := serve.New(serve.Config{})
	defer fresh.Close()
	for _, h := range []http.Handler{ts.Config.Handler, fresh.Handler()} { // the last deregistered; none ever
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/peers", nil))
		if got := strings.TrimSpace(w.Body.String()); got != "[]" {
			t.Fatalf("no peers listed as %s, want [] (as /workers lists no workers)", got)
		}
	}
}

// A peer that answers and then goes silent midway is abandoned once
// PeerIdleTimeout passes without a byte, not at the dump's whole bound
// (5 minutes), and the next peer is tried: the service restores from it.
func TestRecoverFromStalledPeer(t *testing.T) {
	release := make(chan struct{})
	stalled := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"m:default": {"block_size": 16, "events": [`))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer stalled.Close()
	defer close(release)
	whole := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"m:default": {"block_size": 16, "events": [{"worker_id": 7, "event": {"event_id": 1, "data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": 11, "tokens_hash": 1}]}}}}]}}`))
	}))
	defer whole.Close()

	s := serve.New(serve.Config{Peers: []string{stalled.URL, whole.URL}, PeerIdleTimeout: 200 * time.Millisecond})
	defer s.Close()
	start := time.Now()
	rec, err := s.Recover()
	if err != nil || rec.Peer != whole.URL || rec.PeerEvents != 1 {
		t.Fatalf("recovered %+v (%v)", rec, err)
	}
	if took := time.Since(start); took > time.Minute {
		t.Fatalf("the recovery took %v: the silent peer held it", took)
	}
}
