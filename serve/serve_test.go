package serve_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/leaks"
	"github.com/kvradix/kvradix/internal/pages"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix/holdings"
	"github.com/kvradix/kvradix/serve"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaks.Ignore()...)
}

const bs = 16

// post sends v as JSON and decodes the answer into out (if not nil).
func post(t *testing.T, url string, v any, out any) int {
	t.Helper()
	body, ok := v.([]byte)
	if !ok {
		var err error
		if body, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %v: %s", url, err, b)
		}
	}
	return resp.StatusCode
}

func get(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}

func tokens(n int, start uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = start + uint32(i)
	}
	return out
}

// An engine (the project's vLLM-compatible publisher) is registered over
// HTTP; its events reach the model's index; queries by tokens and by hash
// score it in tokens; /workers and /dump show it; 1,000 concurrent clients
// query at once; unregistering drops its blocks. Every bad request gets
// its status, naming the field.
func TestServiceEndToEnd(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	pub := newPublisher(t)
	reg := serve.Registration{InstanceID: 7, Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr(), ModelName: "m", BlockSize: bs}
	if code := post(t, ts.URL+"/register", reg, nil); code != http.StatusCreated {
		t.Fatalf("register: %d", code)
	}

	prompt := tokens(3*bs+5, 100) // three complete blocks
	stored := vllm.Event{Type: vllm.BlockStored, BlockHashes: []uint64{11, 12, 13}, TokenIDs: prompt[:3*bs], BlockSize: bs, Medium: "GPU"}
	var got serve.Scores
	testwait.For(t, "the engine's blocks to be indexed", func() bool {
		if _, err := pub.Publish([]vllm.Event{stored}); err != nil {
			t.Fatal(err)
		}
		got = serve.Scores{}
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
		return got.Scores["7"]["0"] == 3*bs
	})
	if len(got.Frequencies) != 3 || got.Frequencies[2] != 1 || got.TreeSizes["7"]["0"] != 3 {
		t.Fatalf("query: %+v", got)
	}
	local := hashing.LocalHashes(nil, prompt, bs, hashing.Options{})
	var byHash serve.Scores
	if code := post(t, ts.URL+"/query_by_hash", serve.HashQuery{BlockHashes: local[:2], ModelName: "m", TenantID: "default"}, &byHash); code != http.StatusOK || byHash.Scores["7"]["0"] != 2*bs {
		t.Fatalf("query_by_hash: %d %+v", code, byHash)
	}
	var workers []serve.Worker
	if get(t, ts.URL+"/workers", &workers); len(workers) != 1 || workers[0].InstanceID != 7 || workers[0].Endpoints["0"] != pub.Addr() {
		t.Fatalf("workers: %+v", workers)
	}
	var dump map[string]struct {
		BlockSize int               `json:"block_size"`
		Events    []json.RawMessage `json:"events"`
	}
	if get(t, ts.URL+"/dump", &dump); dump["m:default"].BlockSize != bs || len(dump["m:default"].Events) != 3 || !strings.Contains(string(dump["m:default"].Events[0]), `"worker_id":7`) {
		t.Fatalf("dump: %v", dump)
	}

	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`kvradix_events_applied_total{model="m:default"}`, `kvradix_index_pairs{model="m:default"} 3`,
		`kvradix_query_duration_seconds_count{endpoint="query"}`, `kvradix_subscriber_last_sequence{dp_rank="0",instance="7",model="m:default"}`,
		`kvradix_query_blocks_matched_total{model="m:default"}`, `kvradix_query_best_instance_total{instance="7",model="m:default"}`,
		`kvradix_subscriber_down{dp_rank="0",instance="7",model="m:default"} 0`, `kvradix_subscriber_last_message_timestamp_seconds{dp_rank="0",instance="7",model="m:default"}`} {
		if !strings.Contains(string(text), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if problems, err := serve.LintMetrics(svc); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}

	var wg sync.WaitGroup
	var failed sync.Once
	for range 1000 {
		wg.Go(func() {
			b, _ := json.Marshal(serve.Query{TokenIDs: prompt, ModelName: "m"})
			resp, err := http.Post(ts.URL+"/query", "application/json", bytes.NewReader(b))
			if err != nil {
				failed.Do(func() { t.Error(err) })
				return
			}
			var s serve.Scores
			err = json.NewDecoder(resp.Body).Decode(&s)
			resp.Body.Close()
			if err != nil || s.Scores["7"]["0"] != 3*bs {
				failed.Do(func() { t.Errorf("a concurrent query: %+v (%v)", s, err) })
			}
		})
	}
	wg.Wait()

	for _, tc := range []struct {
		name, path string
		body       any
		code       int
		says       string
	}{
		{"another block size", "/register", serve.Registration{InstanceID: 8, Endpoint: pub.Addr(), ModelName: "m", BlockSize: 32}, http.StatusConflict, "block_size"},
		{"twice", "/register", reg, http.StatusConflict, "registered already"},
		{"a udp endpoint", "/register", serve.Registration{InstanceID: 9, Endpoint: "udp://x:1", ModelName: "m", BlockSize: bs}, http.StatusBadRequest, "endpoint"},
		// endpoints that could never be dialled, once registered and failing their dials forever
		{"no port", "/register", serve.Registration{InstanceID: 9, Endpoint: "tcp://x", ModelName: "m", BlockSize: bs}, http.StatusBadRequest, "endpoint: \"tcp://x\": want tcp://host:port"},
		{"a port past 65535", "/register", serve.Registration{InstanceID: 9, Endpoint: "tcp://x:99999", ModelName: "m", BlockSize: bs}, http.StatusBadRequest, "port \"99999\""},
		{"the engine's bind address", "/register", serve.Registration{InstanceID: 9, Endpoint: "tcp://*:5557", ModelName: "m", BlockSize: bs}, http.StatusBadRequest, "give the engine's host"},
		{"two endpoints in one", "/register", serve.Registration{InstanceID: 9, Endpoint: "tcp://x:1 tcp://y:1", ModelName: "m", BlockSize: bs}, http.StatusBadRequest, "a space"},
		{"no ipc path", "/register", serve.Registration{InstanceID: 9, Endpoint: pub.Addr(), ReplayEndpoint: "ipc://", ModelName: "m", BlockSize: bs}, http.StatusBadRequest, "replay_endpoint"},
		{"no model", "/register", serve.Registration{InstanceID: 9, Endpoint: pub.Addr(), BlockSize: bs}, http.StatusBadRequest, "model_name"},
		{"a rank past 2^30-1", "/register", []byte(`{"instance_id": 9, "endpoint": "tcp://x:1", "model_name": "m", "block_size": 16, "dp_rank": 4294967296}`), http.StatusBadRequest, "dp_rank"},
		{"a block size past 2^16", "/register", []byte(`{"instance_id": 9, "endpoint": "tcp://x:1", "model_name": "m2", "block_size": 4294967312}`), http.StatusBadRequest, "block_size"},
		{"a string id", "/register", []byte(`{"instance_id": "seven", "endpoint": "tcp://x:1", "model_name": "m", "block_size": 16}`), http.StatusUnprocessableEntity, "instance_id"},
		{"not JSON", "/query", []byte(`{"token_ids": [1, 2`), http.StatusBadRequest, "body"},
		{"a token over u32", "/query", []byte(`{"token_ids": [4294967296], "model_name": "m"}`), http.StatusUnprocessableEntity, "token_ids"},
		{"too big", "/query", append(append([]byte(`{"model_name": "m", "token_ids": [`), bytes.Repeat([]byte("1,"), 5<<20)...), []byte("1]}")...), http.StatusRequestEntityTooLarge, "larger than"},
		{"an unknown model", "/query", serve.Query{TokenIDs: prompt, ModelName: "other"}, http.StatusNotFound, "no indexer for model=other routing_group=default"},
		{"an unknown tenant", "/query_by_hash", serve.HashQuery{BlockHashes: local, ModelName: "m", TenantID: "t2"}, http.StatusNotFound, "no indexer for model=m routing_group=t2"},
		{"an unknown instance", "/unregister", serve.Unregistration{InstanceID: 99, ModelName: "m"}, http.StatusNotFound, "no instance"},
	} {
		var e map[string]string
		if code := post(t, ts.URL+tc.path, tc.body, &e); code != tc.code || !strings.Contains(e["error"], tc.says) {
			t.Errorf("%s: %d %q, want %d saying %q", tc.name, code, e["error"], tc.code, tc.says)
		}
	}

	if code := post(t, ts.URL+"/unregister", serve.Unregistration{InstanceID: 7, ModelName: "m"}, nil); code != http.StatusOK {
		t.Fatalf("unregister: %d", code)
	}
	testwait.For(t, "the instance's blocks to leave", func() bool {
		var after serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &after)
		return len(after.Scores) == 0
	})
	if get(t, ts.URL+"/workers", &workers); len(workers) != 0 {
		t.Fatalf("workers after unregister: %+v", workers)
	}
}

// dumpHoldings reads /dump's events of model m into holdings.
func dumpHoldings(t *testing.T, url string) holdings.Set {
	t.Helper()
	resp, err := http.Get(url + "/dump")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dump serve.Dump
	if err := json.NewDecoder(resp.Body).Decode(&dump); err != nil {
		t.Fatal(err)
	}
	h := holdings.Set{}
	for _, ev := range dump["m:default"].Events {
		_ = h.Apply(ev)
	}
	return h
}

// A service with a state directory saves its registry and index on Close;
// the next one recovers them, resumes the engine's stream where it stood
// and repairs what was published while it was down from the engine's
// ring, ending equal to every event published. A snapshot damaged on disk
// is refused, and the service starts empty, saying why.
func TestRestartRecovers(t *testing.T) {
	dir := t.TempDir()
	e := newEngine(t, 7)
	savedWith(t, dir, e, 20)

	e.publish(t, 10) // while no service runs
	svc, ts, rec, err := startIn(dir, 0)
	if err != nil || rec.Indexes != 1 || rec.Instances != 1 || rec.Pairs == 0 || len(rec.Failed) != 0 {
		t.Fatalf("recovered %+v (%v)", rec, err)
	}
	// Ready means caught up: what the engine published while no service
	// ran is in the index, though it has published nothing since.
	testwait.For(t, "ready", func() bool { ok, _ := svc.Ready(); return ok })
	e.mu.Lock()
	d := dumpHoldings(t, ts.URL).Diff(e.want)
	e.mu.Unlock()
	if d != "" {
		t.Fatalf("ready, but not caught up: %s", d)
	}
	e.caughtUp(t, ts.URL, "the restarted service to catch up")
	// It resumed where the first stood: it replayed the batches published
	// while it was down (and the empty ones), not the engine's whole ring.
	if n := metric(t, ts.URL, `kvradix_subscriber_replayed_batches_total{dp_rank="0",instance="7",model="m:default"}`); n < 10 || n > 25 {
		t.Fatalf("the restarted service replayed %v batches, want the 10-odd it missed", n)
	}
	ts.Close()
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}

	snaps, _ := filepath.Glob(filepath.Join(dir, "index-*.snap"))
	if len(snaps) != 1 {
		t.Fatalf("state holds snapshots %v, want the last generation's one", snaps)
	}
	snap := snaps[0]
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := os.WriteFile(snap, data, 0o600); err != nil {
		t.Fatal(err)
	}
	svc, ts, rec, err = startIn(dir, 0)
	refused := err != nil && strings.Contains(err.Error(), "corrupt") && rec.Indexes == 0
	defer svc.Close() // a refused state leaves a working, empty service
	defer ts.Close()
	if !refused {
		t.Fatalf("a damaged snapshot: recovered %+v (%v), want it refused as corrupt", rec, err)
	}
	var msg map[string]string
	if code := post(t, ts.URL+"/query", serve.Query{TokenIDs: tokens(bs, 1), ModelName: "m"}, &msg); code != http.StatusNotFound {
		t.Fatalf("the refused state left model m behind: %d %v", code, msg)
	}
}

// engine is a vLLM-compatible publisher, and the reference of what it
// published.
type engine struct {
	id   uint64
	pub  *vllm.Publisher
	gen  *vllm.SynthEngine
	conv *vllm.Converter
	mu   sync.Mutex
	want holdings.Set
}

func newEngine(t *testing.T, id uint64) *engine {
	t.Helper()
	pub := newPublisher(t)
	return &engine{id: id, pub: pub, gen: vllm.NewSynthEngine(id, bs, 4, 0.3), conv: vllm.NewConverter(kvevent.WorkerID(id), bs), want: holdings.Set{}}
}

// register registers e with svc, with a pool of 2^16 blocks: the restarts
// that follow size the restored index for their engines' pools before it
// loads (serve's savedPools).
func (e *engine) register(t *testing.T, svc *serve.Service) {
	t.Helper()
	if err := svc.Register(serve.Registration{InstanceID: e.id, Endpoint: e.pub.Addr(), ReplayEndpoint: e.pub.ReplayAddr(), ModelName: "m", BlockSize: bs, TotalKVBlocks: 1 << 16}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the engine subscribed to", func() bool {
		for _, w := range svc.Workers("m", "") {
			if w.InstanceID == e.id {
				return w.Status == "active"
			}
		}
		return false
	})
}

// publish publishes n batches of two events (safe for concurrent use with
// caughtUp).
func (e *engine) publish(t *testing.T, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for range n {
		evs := []vllm.Event{e.gen.Step(), e.gen.Step()}
		for _, ev := range e.conv.Convert(nil, &vllm.Batch{Events: evs}) {
			_ = e.want.Apply(ev)
		}
		if _, err := e.pub.Publish(evs); err != nil {
			t.Error(err)
			return
		}
	}
}

// caughtUp waits until the service's /dump holds what the engine
// published, sending live messages so that the subscriber repairs what it
// missed.
func (e *engine) caughtUp(t *testing.T, url, what string) {
	t.Helper()
	testwait.For(t, what, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		nudge(t, e.pub)
		return dumpHoldings(t, url).Diff(e.want) == ""
	})
}

// savedWith runs a service on the state directory while engine e
// publishes n batches into it, and closes it once it has indexed them all
// (saving its state).
func savedWith(t *testing.T, dir string, e *engine, n int) {
	t.Helper()
	svc, ts, _, err := startIn(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.register(t, svc)
	e.publish(t, n)
	e.caughtUp(t, ts.URL, "the first service to index every batch")
	ts.Close()
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
}

// startIn starts a service on the state directory, recovering from it.
func startIn(dir string, every time.Duration) (*serve.Service, *httptest.Server, serve.Recovered, error) {
	svc := serve.New(serve.Config{StateDir: dir, SaveEvery: every})
	rec, err := svc.Recover()
	return svc, httptest.NewServer(svc.Handler()), rec, err
}

// A restart whose engine is gone opens at once (it dialled each saved
// engine in turn, 5 s each, before serving): the engine shows as not up,
// its restored blocks are served, /ready does not wait on it, and
// unregistering it drops its blocks.
func TestRestartWithEnginesGone(t *testing.T) {
	dir := t.TempDir()
	e := newEngine(t, 7)
	savedWith(t, dir, e, 5)
	e.pub.Close()

	start := time.Now()
	svc, ts, rec, err := startIn(dir, 0)
	if err != nil || rec.Instances != 1 || rec.Pairs == 0 {
		t.Fatalf("recovered %+v (%v)", rec, err)
	}
	defer svc.Close()
	defer ts.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the restart took %v with its engine gone", took)
	}
	if ws := svc.Workers("m", ""); len(ws) != 1 || ws[0].Status == "active" {
		t.Fatalf("workers %+v, want instance 7 not active", ws)
	}
	testwait.For(t, "ready", func() bool { ok, _ := svc.Ready(); return ok })
	if h := dumpHoldings(t, ts.URL); h.Diff(holdings.Set{}) == "" {
		t.Fatal("the restored blocks are not served")
	}
	// Another engine keeps the model's index, so that instance 7's blocks
	// must leave it rather than go with it.
	newEngine(t, 8).register(t, svc)
	if err := svc.Unregister(serve.Unregistration{InstanceID: 7, ModelName: "m"}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "its blocks gone", func() bool {
		var dump serve.Dump
		get(t, ts.URL+"/dump", &dump)
		for _, ev := range dump["m:default"].Events {
			if ev.WorkerID == 7 {
				return false
			}
		}
		return dump["m:default"].BlockSize == bs
	})
}

// An engine registered after it published, and idle since (PUB/SUB drops
// what was sent before the subscription), is caught up from its replay
// ring at once, not at its next batch: /ready waits for that, and its
// blocks are answered without the engine sending anything more.
func TestRegisterCatchesUpAnIdleEngine(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	pub := newPublisher(t)
	prompt := tokens(2*bs, 400)
	if _, err := pub.Publish([]vllm.Event{{Type: vllm.BlockStored, BlockHashes: []uint64{51, 52}, TokenIDs: prompt, BlockSize: bs, Medium: "GPU"}}); err != nil {
		t.Fatal(err)
	}
	reg := serve.Registration{InstanceID: 9, Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr(), ModelName: "m", BlockSize: bs}
	if code := post(t, ts.URL+"/register", reg, nil); code != http.StatusCreated {
		t.Fatalf("register: %d", code)
	}
	testwait.For(t, "ready", func() bool { ready, _ := svc.Ready(); return ready })
	testwait.For(t, "the blocks published before the registration", func() bool {
		var got serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
		return got.Scores["9"]["0"] == 2*bs
	})
	if n := metric(t, ts.URL, `kvradix_subscriber_replayed_batches_total{dp_rank="0",instance="9",model="m:default"}`); n != 1 {
		t.Fatalf("%v batches replayed, want 1", n)
	}
}

// The periodic saves, while the engine publishes, are consistent cuts: a
// service that crashed after one (its directory copied at a moment between
// two, the service never closed on the copy) recovers and ends equal to
// everything published.
func TestSaveWhileServing(t *testing.T) {
	dir, crashed := t.TempDir(), t.TempDir()
	e := newEngine(t, 3)
	svc, ts, _, err := startIn(dir, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	defer ts.Close()
	e.register(t, svc)
	e.publish(t, 5)
	e.caughtUp(t, ts.URL, "the engine's first batches")
	stop := make(chan struct{})
	var publishing sync.WaitGroup
	halt := sync.OnceFunc(func() { close(stop); publishing.Wait() })
	defer halt()
	publishing.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				e.publish(t, 1)
			}
		}
	})
	testwait.For(t, "periodic saves while the engine publishes", func() bool {
		return metric(t, ts.URL, `kvradix_state_saves_total{result="ok"}`) >= 3
	})
	copyState(t, dir, crashed) // what a crash now would leave
	halt()

	again, ts2, rec, err := startIn(crashed, 0)
	if err != nil || rec.Instances != 1 || rec.Pairs == 0 {
		t.Fatalf("recovered %+v (%v)", rec, err)
	}
	defer again.Close()
	defer ts2.Close()
	e.caughtUp(t, ts2.URL, "the service restarted from the mid-stream save to catch up")
}

// copyState copies the state directory's files as they stand, as a crash
// would leave them: state.json, then the snapshots it names, again if a
// newer save removed one meanwhile.
func copyState(t *testing.T, from, to string) {
	t.Helper()
	testwait.For(t, "a whole generation of the state to copy", func() bool {
		data, err := os.ReadFile(filepath.Join(from, "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		var st struct{ Indexes []struct{ File string } }
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{"state.json": data}
		for _, ix := range st.Indexes {
			if files[ix.File], err = os.ReadFile(filepath.Join(from, ix.File)); err != nil {
				return false // replaced by the next generation: again
			}
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(to, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return true
	})
}

// metric returns a sample's value from /metrics.
func metric(t *testing.T, url, sample string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	t.Fatalf("/metrics has no %s", sample)
	return 0
}

// newPublisher is a vLLM-compatible publisher on loopback, with a replay
// socket, closed when the test ends.
func newPublisher(t testing.TB) *vllm.Publisher {
	t.Helper()
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// nudge publishes an empty batch: its sequence number shows a subscriber
// that joined late, or lost a batch on the wire, the gap to repair. Tests
// waiting for what an engine published call it on each try: PUB/SUB drops
// what is sent before a subscription reaches the engine.
func nudge(t testing.TB, pub *vllm.Publisher) {
	t.Helper()
	if _, err := pub.Publish(nil); err != nil {
		t.Fatal(err)
	}
}

// registerPublishers registers n vLLM-compatible publishers with svc as
// instances 1..n of model "m".
func registerPublishers(t testing.TB, svc *serve.Service, n int) []*vllm.Publisher {
	t.Helper()
	return registerPools(t, svc, n, 0)
}

// registerPools registers n publishers as registerPublishers does, each
// with a KV pool of pool blocks (total_kv_blocks) if not 0.
func registerPools(t testing.TB, svc *serve.Service, n, pool int) []*vllm.Publisher {
	t.Helper()
	var pubs []*vllm.Publisher
	for id := range uint64(n) {
		pub := newPublisher(t)
		pubs = append(pubs, pub)
		if err := svc.Register(serve.Registration{InstanceID: id + 1, Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr(), ModelName: "m", BlockSize: bs, TotalKVBlocks: pool}); err != nil {
			t.Fatal(err)
		}
	}
	waitActive(t, svc, n)
	return pubs
}

// waitActive waits until n instances are active (Register does not wait
// for the engine).
func waitActive(t testing.TB, svc *serve.Service, n int) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("%d instances active", n), func() bool {
		active := 0
		for _, w := range svc.Workers("", "") {
			if w.Status == "active" {
				active++
			}
		}
		return active == n
	})
}

// POST /route sends a prompt to the instance holding its prefix and
// admits it into that instance's load; first_token and complete release
// it; a request id in flight cannot be reused; one never completed
// expires after RequestTTL; bad requests get their statuses.
func TestRoute(t *testing.T) {
	svc := serve.New(serve.Config{RequestTTL: 300 * time.Millisecond})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	pubs := registerPublishers(t, svc, 2)
	prompt := tokens(3*bs+2, 500)
	stored := vllm.Event{Type: vllm.BlockStored, BlockHashes: []uint64{21, 22, 23}, TokenIDs: prompt[:3*bs], BlockSize: bs, Medium: "GPU"}
	testwait.For(t, "instance 2 to hold the prompt", func() bool {
		pubs[1].Publish([]vllm.Event{stored})
		var got serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
		return got.Scores["2"]["0"] == 3*bs
	})
	var a serve.RouteAnswer
	if code := post(t, ts.URL+"/route", serve.RouteRequest{TokenIDs: prompt, ModelName: "m"}, &a); code != http.StatusOK || a.InstanceID != 2 || a.OverlapBlocks != 3 || a.RequestID == "" {
		t.Fatalf("route: %d %+v", code, a)
	}
	// The cost terms: instance 2 must prefill the 2 tokens past its 3
	// blocks, instance 1 the whole prompt; each adds 3 decode blocks.
	want := []serve.Candidate{
		{InstanceID: 1, PrefillTokens: 3*bs + 2, DecodeBlocks: 3, Cost: 8*float64(3*bs+2)/bs + 3},
		{InstanceID: 2, OverlapBlocks: 3, PrefillTokens: 2, DecodeBlocks: 3, Cost: 8*2.0/bs + 3},
	}
	if !reflect.DeepEqual(a.Candidates, want) || a.Candidate != want[1] || a.OverlapWeight != 8 || a.PromptBlocks != 3 {
		t.Fatalf("route's terms: %+v, want chosen %+v of %+v", a, want[1], want)
	}
	if n := metric(t, ts.URL, `kvradix_route_decisions_total{instance="2",model="m:default"}`); n != 1 {
		t.Fatalf("%v routes to instance 2 counted, want 1", n)
	}
	if n := metric(t, ts.URL, `kvradix_route_duration_seconds_count`); n != 1 {
		t.Fatalf("%v route latencies observed, want 1", n)
	}
	for _, step := range []struct {
		path string
		code int
	}{{"/first_token", 200}, {"/complete", 200}, {"/complete", 404}, {"/first_token", 404}} {
		if code := post(t, ts.URL+"/requests/"+a.RequestID+step.path, []byte("{}"), nil); code != step.code {
			t.Fatalf("%s: %d, want %d", step.path, code, step.code)
		}
	}
	if code := post(t, ts.URL+"/route", serve.RouteRequest{TokenIDs: prompt, ModelName: "m", RequestID: "x"}, &a); code != http.StatusOK || a.RequestID != "x" {
		t.Fatalf("route with an id: %d %+v", code, a)
	}
	var e map[string]string
	for _, tc := range []struct {
		name string
		req  serve.RouteRequest
		code int
	}{
		{"an id in flight", serve.RouteRequest{TokenIDs: prompt, ModelName: "m", RequestID: "x"}, http.StatusConflict},
		{"tokens and hashes", serve.RouteRequest{TokenIDs: prompt, BlockHashes: []uint64{1}, ModelName: "m"}, http.StatusBadRequest},
		{"neither", serve.RouteRequest{ModelName: "m"}, http.StatusBadRequest},
		{"an unknown model", serve.RouteRequest{TokenIDs: prompt, ModelName: "other"}, http.StatusNotFound},
	} {
		if code := post(t, ts.URL+"/route", tc.req, &e); code != tc.code {
			t.Errorf("%s: %d %v, want %d", tc.name, code, e, tc.code)
		}
	}
	testwait.For(t, "request x to expire", func() bool {
		return post(t, ts.URL+"/requests/x/first_token", []byte("{}"), nil) == http.StatusNotFound
	})
}

// The requests in flight hold at most Config.MaxRoutedBlocks blocks, each
// its prompt's and RouteOverheadBlocks: past it a route is refused (503), and completions,
// an instance leaving and expiry give blocks back. Clients that route and
// never complete made the scheduler keep every block until the TTL, with
// no bound (about 150 bytes a block).
func TestRoutedBlocksBounded(t *testing.T) {
	svc := serve.New(serve.Config{MaxRoutedBlocks: 20, RequestTTL: serve.MinRequestTTL})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	for id := range uint64(2) {
		if code := post(t, ts.URL+"/register", serve.Registration{InstanceID: id + 1, ModelName: "m", BlockSize: bs, TotalKVBlocks: 64}, nil); code != http.StatusCreated {
			t.Fatalf("register: %d", code)
		}
	}
	route := func(id string, blocks int) (int, string) {
		t.Helper()
		var e struct{ Error string }
		code := post(t, ts.URL+"/route", serve.RouteRequest{TokenIDs: tokens(blocks*bs+1, uint32(len(id))*1000), ModelName: "m", RequestID: id}, &e)
		return code, e.Error
	}
	inFlight := func() float64 { return metric(t, ts.URL, `kvradix_requests_in_flight{what="blocks"}`) }
	for _, step := range []struct {
		id     string
		blocks int
		code   int
	}{{"a", 4, 200}, {"bb", 4, 200}, {"ccc", 4, 503}, {"d", 0, 200}, {"f", 0, 503}} { // each counts 4 more
		if code, why := route(step.id, step.blocks); code != step.code || code == 503 && !strings.Contains(why, "at most 20") {
			t.Fatalf("route %s of %d blocks: %d %q, want %d", step.id, step.blocks, code, why, step.code)
		}
	}
	if n := inFlight(); n != 20 {
		t.Fatalf("%v blocks in flight, want 20", n)
	}
	if code := post(t, ts.URL+"/requests/a/complete", []byte("{}"), nil); code != http.StatusOK {
		t.Fatalf("complete: %d", code)
	}
	if code, why := route("ccc", 4); code != http.StatusOK {
		t.Fatalf("a route after a completion: %d %q", code, why)
	}
	testwait.For(t, "the routes to expire, giving their blocks back", func() bool { return inFlight() == 0 })
	if code, why := route("g", 16); code != http.StatusOK {
		t.Fatalf("a route after the expiries: %d %q", code, why)
	}
	if code := post(t, ts.URL+"/unregister", serve.Unregistration{InstanceID: 1, ModelName: "m"}, nil); code != http.StatusOK {
		t.Fatalf("unregister: %d", code)
	}
	if code := post(t, ts.URL+"/unregister", serve.Unregistration{InstanceID: 2, ModelName: "m"}, nil); code != http.StatusOK {
		t.Fatalf("unregister: %d", code)
	}
	if code := post(t, ts.URL+"/register", serve.Registration{InstanceID: 3, ModelName: "m", BlockSize: bs, TotalKVBlocks: 64}, nil); code != http.StatusCreated {
		t.Fatalf("register: %d", code)
	}
	if code, why := route("h", 16); code != http.StatusOK { // g's instance left: its blocks freed
		t.Fatalf("a route after its instance left: %d %q", code, why)
	}
}

// With Config.Tiers: an engine's offload (its tail stored on the CPU, then
// removed from the GPU) shows in tier_scores, not in the device scores; a
// route goes to the instance holding the prompt on the host rather than
// to one holding less of it on the device; a restart keeps the tiers.
func TestTiers(t *testing.T) {
	dir := t.TempDir()
	start := func() (*serve.Service, *httptest.Server) {
		svc := serve.New(serve.Config{Tiers: true, StateDir: dir})
		if _, err := svc.Recover(); err != nil {
			t.Fatal(err)
		}
		return svc, httptest.NewServer(svc.Handler())
	}
	svc, ts := start()
	prompt := tokens(4*bs, 900)
	local := hashing.LocalHashes(nil, prompt, bs, hashing.Options{})
	pubs := registerPublishers(t, svc, 2)
	p1 := uint64(31)
	offload := [][]vllm.Event{ // instance 1: 4 blocks on the GPU, the last 3 moved to the CPU
		{{Type: vllm.BlockStored, BlockHashes: []uint64{31, 32, 33, 34}, TokenIDs: prompt, BlockSize: bs, Medium: "GPU"}},
		{{Type: vllm.BlockStored, BlockHashes: []uint64{32, 33, 34}, ParentBlockHash: &p1, TokenIDs: prompt[bs:], BlockSize: bs, Medium: "CPU"},
			{Type: vllm.BlockRemoved, BlockHashes: []uint64{32, 33, 34}, Medium: "GPU"}},
	}
	device := [][]vllm.Event{ // instance 2: the first 2 blocks on the GPU
		{{Type: vllm.BlockStored, BlockHashes: []uint64{41, 42}, TokenIDs: prompt[:2*bs], BlockSize: bs, Medium: "GPU"}},
	}
	want := map[string]map[string]uint64{"1": {"device": bs, "host_pinned": 4 * bs, "disk": 4 * bs, "external": 4 * bs},
		"2": {"device": 2 * bs, "host_pinned": 2 * bs, "disk": 2 * bs, "external": 2 * bs}}
	var got serve.Scores
	testwait.For(t, "both instances' blocks in their tiers", func() bool {
		for i, batches := range [][][]vllm.Event{offload, device} {
			for _, b := range batches {
				pubs[i].Publish(b)
			}
		}
		post(t, ts.URL+"/query_by_hash", serve.HashQuery{BlockHashes: local, ModelName: "m"}, &got)
		// Scores and tier scores are two lookups: both must have seen the
		// events (the first answer may come between them).
		return reflect.DeepEqual(got.TierScores["1"]["0"], want["1"]) && reflect.DeepEqual(got.TierScores["2"]["0"], want["2"]) &&
			got.Scores["1"]["0"] == bs && got.Scores["2"]["0"] == 2*bs
	})
	if got.Scores["1"]["0"] != bs || got.Scores["2"]["0"] != 2*bs {
		t.Fatalf("device scores %v, want instance 1 at %d and 2 at %d", got.Scores, bs, 2*bs)
	}
	var a serve.RouteAnswer
	if code := post(t, ts.URL+"/route", serve.RouteRequest{BlockHashes: local, ModelName: "m"}, &a); code != http.StatusOK || a.InstanceID != 1 {
		t.Fatalf("route: %d %+v, want instance 1 (3.4 blocks' prefill saved against 2)", code, a)
	}
	ts.Close()
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	svc, ts = start()
	defer svc.Close()
	defer ts.Close()
	post(t, ts.URL+"/query_by_hash", serve.HashQuery{BlockHashes: local, ModelName: "m"}, &got)
	if !reflect.DeepEqual(got.TierScores["1"]["0"], want["1"]) {
		t.Fatalf("after a restart: tier scores %v, want instance 1 at %v", got.TierScores, want["1"])
	}
}

// Engines that publish events and register with total_kv_blocks size
// their model's index for their pools summed, as IndexBlocks does: the
// table's memory (8 bytes a block or more) is taken by the time they are
// active, against none for engines registered without it (the heap the
// resize warms in the background dropped first); and the index then
// takes their events as before.
func TestRegisteredPoolsSizeTheIndex(t *testing.T) {
	const engines, pool = 2, 1 << 19
	grew := map[int]int64{}
	for _, p := range []int{0, pool} {
		svc := serve.New(serve.Config{})
		before := liveHeap(t)
		pubs := registerPools(t, svc, engines, p) // the resize warms ahead: liveHeap waits for it
		grew[p] = liveHeap(t) - before
		ts := httptest.NewServer(svc.Handler())
		gen, conv := vllm.NewSynthEngine(1, bs, 4, 0.3), vllm.NewConverter(1, bs)
		want := holdings.Set{}
		for range 20 {
			evs := []vllm.Event{gen.Step(), gen.Step()}
			for _, ev := range conv.Convert(nil, &vllm.Batch{Events: evs}) {
				_ = want.Apply(ev)
			}
			if _, err := pubs[0].Publish(evs); err != nil {
				t.Fatal(err)
			}
		}
		testwait.For(t, "the index to hold what engine 1 published", func() bool {
			nudge(t, pubs[0])
			return reflect.DeepEqual(dumpHoldings(t, ts.URL), want)
		})
		ts.Close()
		if err := svc.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if grew[pool]-grew[0] < 8*engines*pool {
		t.Fatalf("registering engines with %d blocks each took %d bytes of heap, without %d: want %d more", pool, grew[pool], grew[0], 8*engines*pool)
	}
}

// liveHeap returns the heap live after a collection, once no warm
// (pages.WarmAhead) runs: a warm holds its chunks until its own
// collection, so one running at the first of two readings and done by
// the second made an index read 13 MB smaller than it is (seen once in
// TestIndexBlocks, under -race, a warm of another test's growing index).
func liveHeap(t *testing.T) int64 {
	t.Helper()
	testwait.For(t, "warms ahead to end", func() bool { return !pages.Warming() })
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// A service with Config.IndexBlocks sizes each model's index when it
// creates it (its table's memory taken then, not as it fills), and
// answers as one grown as it fills.
func TestIndexBlocks(t *testing.T) {
	const blocks = 1 << 20
	answers, grew := map[int]serve.Scores{}, map[int]int64{}
	for _, sized := range []int{0, blocks} {
		svc := serve.New(serve.Config{IndexBlocks: sized})
		// Live heap at both ends: a sized index's creation runs a
		// collection (pages.Warm), which freed other tests' garbage and
		// made the sized index look smaller than the grown one under load.
		before := liveHeap(t)
		idx := serve.IndexForTest(svc, "m", 16)
		grew[sized] = liveHeap(t) - before
		hashes := make([]uint64, 64)
		for i := range hashes {
			hashes[i] = uint64(i+1) * 0x9E3779B97F4A7C15
		}
		for w := range 8 {
			st := kvevent.Stored{}
			for i, h := range hashes[:8*(w+1)] {
				st.Blocks = append(st.Blocks, kvevent.StoredBlock{BlockHash: uint64(i) + 1000, TokensHash: h})
			}
			if err := idx.ApplyEvent(kvevent.RouterEvent{WorkerID: kvevent.WorkerID(w), Event: kvevent.Event{Data: st}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := idx.Flush(); err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(svc.Handler())
		var got serve.Scores
		if code := post(t, ts.URL+"/query_by_hash", serve.HashQuery{BlockHashes: hashes, ModelName: "m"}, &got); code != http.StatusOK {
			t.Fatalf("IndexBlocks %d: /query_by_hash answered %d", sized, code)
		}
		answers[sized] = got
		ts.Close()
		if err := svc.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if grew[blocks]-grew[0] < 8*blocks {
		t.Fatalf("creating a sized index took %d bytes of heap, a grown one %d: want %d more", grew[blocks], grew[0], 8*blocks)
	}
	if len(answers[0].Scores) != 8 || !reflect.DeepEqual(answers[0].Scores, answers[blocks].Scores) {
		t.Fatalf("grown and sized indexes answer differently: %v against %v", answers[0].Scores, answers[blocks].Scores)
	}
}
