package serve_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/serve"
)

// routeTo routes a prompt with an id and returns the chosen instance.
func routeTo(t *testing.T, url string, prompt []uint32, id string) serve.RouteAnswer {
	t.Helper()
	var a serve.RouteAnswer
	if code := post(t, url+"/route", serve.RouteRequest{TokenIDs: prompt, ModelName: "m", RequestID: id}, &a); code != http.StatusOK {
		t.Fatalf("route %s: %d", id, code)
	}
	return a
}

// Engines registered with total_kv_blocks and no endpoint publish no
// events: the service routes them on the model of their caches, which
// follows /route and /complete. A prompt sharing a long prefix with one
// routed before goes where that one went; /query and /workers show the
// prediction; an engine whose pool is too small for two prompts forgets
// the first once it completes and another is routed there.
func TestEventFreeEngines(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	for id := range uint64(2) {
		if code := post(t, ts.URL+"/register", serve.Registration{InstanceID: id + 1, ModelName: "m", BlockSize: bs, TotalKVBlocks: 10}, nil); code != http.StatusCreated {
			t.Fatalf("register %d: %d", id+1, code)
		}
	}
	var e map[string]string
	if code := post(t, ts.URL+"/register", serve.Registration{InstanceID: 3, ModelName: "m", BlockSize: bs}, &e); code != http.StatusBadRequest {
		t.Fatalf("neither endpoint nor total_kv_blocks: %d %v, want 400", code, e)
	}
	var ws []serve.Worker
	get(t, ts.URL+"/workers", &ws)
	if len(ws) != 2 || ws[0].Source != "none" || ws[0].Status != "active" || ws[0].Predicted != "event_free" || ws[0].TotalKVBlocks != 10 {
		t.Fatalf("/workers: %+v", ws)
	}
	prompt := tokens(6*bs+3, 100)
	first := routeTo(t, ts.URL, prompt, "a")
	if first.OverlapBlocks != 0 || !first.Predicted {
		t.Fatalf("first route: %+v", first)
	}
	post(t, ts.URL+"/requests/a/first_token", []byte("{}"), nil)
	second := routeTo(t, ts.URL, append(prompt[:5*bs:5*bs], tokens(2*bs, 9000)...), "b")
	if second.InstanceID != first.InstanceID || second.OverlapBlocks != 5 {
		t.Fatalf("second route: %+v, want instance %d with 5 blocks predicted", second, first.InstanceID)
	}
	var got serve.Scores
	post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
	if n := got.Scores[itoa(int64(first.InstanceID))]["0"]; n != 6*bs {
		t.Fatalf("/query: %v, want instance %d with %d tokens", got.Scores, first.InstanceID, 6*bs)
	}
	// Both complete; a third prompt of 8 blocks routed to the same
	// instance (forced: it is the only one left) leaves room for 1 of the
	// others' blocks in a pool of 10 (8 + 1 for its output).
	for _, id := range []string{"a", "b"} {
		if code := post(t, ts.URL+"/requests/"+id+"/complete", []byte("{}"), nil); code != http.StatusOK {
			t.Fatalf("complete %s: %d", id, code)
		}
	}
	other := 3 - first.InstanceID
	if code := post(t, ts.URL+"/unregister", serve.Unregistration{InstanceID: other, ModelName: "m"}, nil); code != http.StatusOK {
		t.Fatalf("unregister %d: %d", other, code)
	}
	routeTo(t, ts.URL, tokens(8*bs, 50000), "c")
	post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
	if n := got.Scores[itoa(int64(first.InstanceID))]["0"]; n != bs {
		t.Fatalf("/query after eviction: %v, want %d tokens (one block) left", got.Scores, bs)
	}
	if n := metric(t, ts.URL, `kvradix_engines_predicted{model="m:default",reason="event_free"}`); n != 1 {
		t.Fatalf("%v engines predicted without events, want 1", n)
	}
	// c's 8 blocks and a's first are held; c leases; a's and b's 7 others
	// were evicted.
	for sample, want := range map[string]float64{`kvradix_approx_blocks{model="m:default",what="blocks"}`: 9,
		`kvradix_approx_blocks{model="m:default",what="leases"}`: 1, `kvradix_approx_evicted_blocks_total{model="m:default"}`: 7} {
		if n := metric(t, ts.URL, sample); n != want {
			t.Errorf("%s = %v, want %v", sample, n, want)
		}
	}
}

// An engine registered with an endpoint and total_kv_blocks is modelled
// beside its events: the metrics compare the two on routes to it. When it
// goes quiet for longer than EventsStaleAfter it is routed on the model;
// when it speaks again, on its events.
func TestStaleEventsFallBack(t *testing.T) {
	// Seconds, not less: on a loaded machine the routes on events below
	// must come before the engine counts as quiet.
	svc := serve.New(serve.Config{EventsStaleAfter: 3 * time.Second, RequestTTL: time.Minute})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := svc.Register(serve.Registration{InstanceID: 1, Endpoint: pub.Addr(), ModelName: "m", BlockSize: bs, TotalKVBlocks: 1000}); err != nil {
		t.Fatal(err)
	}
	waitActive(t, svc, 1)
	prompt := tokens(3*bs+2, 700)
	routeTo(t, ts.URL, prompt, "a")
	// The engine computes the prompt and says so.
	stored := vllm.Event{Type: vllm.BlockStored, BlockHashes: []uint64{31, 32, 33}, TokenIDs: prompt[:3*bs], BlockSize: bs, Medium: "GPU"}
	testwait.For(t, "the engine's blocks indexed", func() bool {
		pub.Publish([]vllm.Event{stored})
		var got serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
		return got.Scores["1"]["0"] == 3*bs
	})
	if a := routeTo(t, ts.URL, prompt, "b"); a.OverlapBlocks != 3 || a.Predicted {
		t.Fatalf("route on events: %+v", a)
	}
	for sample, want := range map[string]float64{"kvradix_approx_predicted_blocks_total": 3 + 0, "kvradix_approx_reported_blocks_total": 3, "kvradix_approx_confirmed_blocks_total": 3} {
		if n := metric(t, ts.URL, sample+`{model="m:default"}`); n != want {
			t.Errorf("%s = %v, want %v", sample, n, want)
		}
	}
	testwait.For(t, "the quiet engine routed on predictions", func() bool {
		var ws []serve.Worker
		get(t, ts.URL+"/workers", &ws)
		return len(ws) == 1 && ws[0].Predicted == "stale"
	})
	// A prompt the model knows and the events do not: routed on the model.
	if a := routeTo(t, ts.URL, append(prompt[:3*bs:3*bs], tokens(3*bs, 4000)...), "c"); a.OverlapBlocks != 3 || !a.Predicted {
		t.Fatalf("route while stale: %+v", a)
	}
	testwait.For(t, "the engine routed on events again", func() bool {
		pub.Publish([]vllm.Event{stored})
		var ws []serve.Worker
		get(t, ts.URL+"/workers", &ws)
		return len(ws) == 1 && ws[0].Predicted == ""
	})
}

// An engine without events is saved with the registry and back after a
// restart (its model starts empty: predictions are not saved).
func TestEventFreeEngineSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	svc, ts, _, err := startIn(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Register(serve.Registration{InstanceID: 7, ModelName: "m", BlockSize: bs, TotalKVBlocks: 64}); err != nil {
		t.Fatal(err)
	}
	routeTo(t, ts.URL, tokens(4*bs, 1), "a")
	ts.Close()
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	svc, ts, rec, err := startIn(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	defer ts.Close()
	var ws []serve.Worker
	get(t, ts.URL+"/workers", &ws)
	if rec.Instances != 1 || len(ws) != 1 || ws[0].InstanceID != 7 || ws[0].Predicted != "event_free" || ws[0].TotalKVBlocks != 64 {
		t.Fatalf("after the restart: %+v, %+v", rec, ws)
	}
	if a := routeTo(t, ts.URL, tokens(4*bs, 1), "b"); a.InstanceID != 7 || a.OverlapBlocks != 0 {
		t.Fatalf("route after the restart: %+v", a)
	}
}

// With PredictTTL, a route counts the decisions of the last while: a
// sibling of a prompt, routed before the prompt's engine stores a block
// of it, goes where the prompt went (without, the first's load sends it
// elsewhere); /query still answers what engines hold.
func TestPredictTTLFollowsBursts(t *testing.T) {
	for _, ttl := range []time.Duration{0, time.Minute} {
		svc := serve.New(serve.Config{PredictTTL: ttl})
		ts := httptest.NewServer(svc.Handler())
		registerPublishers(t, svc, 2)
		prompt := tokens(20*bs+2, 900)
		first := routeTo(t, ts.URL, prompt, "a")
		post(t, ts.URL+"/requests/a/first_token", []byte("{}"), nil)
		// A sibling: the first's 15 leading blocks, then its own.
		second := routeTo(t, ts.URL, append(prompt[:15*bs:15*bs], tokens(5*bs+2, 50000)...), "b")
		if follows := second.InstanceID == first.InstanceID; follows != (ttl > 0) || second.Predicted != (ttl > 0) || ttl > 0 && second.OverlapBlocks != 15 {
			t.Errorf("ttl %v: second route %+v after the first's %d: follows %v", ttl, second, first.InstanceID, follows)
		}
		var got serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
		if len(got.Scores) != 0 {
			t.Errorf("ttl %v: /query answers %v, want nothing: no engine stored a block", ttl, got.Scores)
		}
		ts.Close()
		svc.Close()
	}
}
