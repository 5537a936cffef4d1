package serve_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/serve"
)

// Shapes of Dynamo's current standalone indexer the service accepts beside
// its own: 201 {"status": "ok"} for a registration, block hashes of 2^63
// and over sent as negative int64s, routing_group as the partition
// (tenant_id its synonym; the two differing refused), the instances map,
// cache_salt mixed as Dynamo mixes it (and refused by /query_by_hash), and
// /ready.
func TestDynamoShapes(t *testing.T) {
	dir := t.TempDir()
	svc := serve.New(serve.Config{StateDir: dir})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	var st map[string]string
	if code := get(t, ts.URL+"/ready", &st); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready before Recover: %d %v", code, st)
	}
	if _, err := svc.Recover(); err != nil {
		t.Fatal(err)
	}
	if code := get(t, ts.URL+"/ready", &st); code != http.StatusOK {
		t.Fatalf("/ready after Recover: %d %v", code, st)
	}
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if code := post(t, ts.URL+"/register", []byte(`{"instance_id": 1, "endpoint": "`+pub.Addr()+`", "model_name": "m", "block_size": 16, "routing_group": "g1"}`), &st); code != http.StatusCreated || st["status"] != "ok" {
		t.Fatalf("register with routing_group: %d %v", code, st)
	}
	// The same instance id in another model is another worker; /workers
	// says which is which, and filters by model and routing group.
	pub2, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m2"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub2.Close()
	if code := post(t, ts.URL+"/register", []byte(`{"instance_id": 1, "endpoint": "`+pub2.Addr()+`", "model_name": "m2", "block_size": 32}`), nil); code != http.StatusCreated {
		t.Fatalf("register in model m2: %d", code)
	}
	waitActive(t, svc, 2)
	worker := func(model, group string, bs int, ep string) serve.Worker {
		return serve.Worker{InstanceID: 1, Source: "zmq", Status: "active", ModelName: model, RoutingGroup: group, BlockSize: bs,
			Endpoints: map[string]string{"0": ep}, Listeners: map[string]serve.Listener{"0": {Endpoint: ep, Status: "active"}}}
	}
	m, m2 := worker("m", "g1", 16, pub.Addr()), worker("m2", "default", 32, pub2.Addr())
	for query, want := range map[string][]serve.Worker{
		"":                               {m, m2},
		"?model_name=m&routing_group=g1": {m},
		"?model_name=m2":                 {m2},
		"?routing_group=g2":              {},
		"?model_name=nothing":            {},
	} {
		var got []serve.Worker
		if code := get(t, ts.URL+"/workers"+query, &got); code != http.StatusOK || !reflect.DeepEqual(got, want) {
			t.Errorf("/workers%s: %d %+v, want %+v", query, code, got, want)
		}
	}

	prompt := tokens(2*bs, 40)
	local := hashing.LocalHashes(nil, prompt, bs, hashing.Options{})
	testwait.For(t, "the engine's blocks in group g1", func() bool {
		pub.Publish([]vllm.Event{{Type: vllm.BlockStored, BlockHashes: []uint64{5, 6}, TokenIDs: prompt, BlockSize: bs, Medium: "GPU"}})
		var got serve.Scores
		post(t, ts.URL+"/query_by_hash", serve.HashQuery{BlockHashes: local, ModelName: "m", TenantID: "g1"}, &got)
		return got.Scores["1"]["0"] == 2*bs
	})
	// The same hashes, signed as Dynamo's clients send them (a hash of 2^63
	// or over goes negative), in group g1 named either way.
	if local[0] < 1<<63 && local[1] < 1<<63 {
		t.Fatalf("the prompt's hashes %x are all below 2^63: pick a prompt with one above", local)
	}
	signed := []byte(`{"model_name": "m", "routing_group": "g1", "block_hashes": [`)
	for i, h := range local {
		if i > 0 {
			signed = append(signed, ',')
		}
		signed = append(signed, []byte(itoa(int64(h)))...)
	}
	signed = append(signed, "]}"...)
	var got serve.Scores
	if code := post(t, ts.URL+"/query_by_hash", signed, &got); code != http.StatusOK || got.Scores["1"]["0"] != 2*bs {
		t.Fatalf("signed hashes: %d %v", code, got.Scores)
	}
	// Dynamo's instances map, in tokens (no tiers: cpu and disk are the
	// device's prefix), beside the flat scores.
	if want := (serve.Instance{LongestMatched: 2 * bs, GPU: 2 * bs, DP: map[string]uint64{"0": 2 * bs}, CPU: 2 * bs, Disk: 2 * bs}); !reflect.DeepEqual(got.Instances["1"], want) {
		t.Fatalf("instances %+v, want {\"1\": %+v}", got.Instances, want)
	}
	// A salted /query hashes as Dynamo does (the salt in the seed, as its
	// cache namespace): it matches what engines stored under those hashes.
	salted := hashing.LocalHashes(nil, prompt, bs, hashing.Options{Salt: "tenant-a"})
	if seed := (&hashing.Options{Salt: "tenant-a"}).SeedFor(); seed != hashing.Seed+xxh3.HashStringSeed("tenant-a", 1) {
		t.Fatalf("the salted seed %d is not Dynamo's", seed)
	}
	testwait.For(t, "the salted blocks", func() bool {
		pub.Publish([]vllm.Event{{Type: vllm.BlockStored, BlockHashes: []uint64{15, 16}, TokenIDs: prompt, BlockSize: bs, Medium: "GPU", CacheSalt: "tenant-a"}})
		var got serve.Scores
		post(t, ts.URL+"/query_by_hash", serve.HashQuery{BlockHashes: salted, ModelName: "m", TenantID: "g1"}, &got)
		return got.Scores["1"]["0"] == 2*bs
	})
	if code := post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m", RoutingGroup: "g1", CacheSalt: "tenant-a"}, &got); code != http.StatusOK || got.Scores["1"]["0"] != 2*bs {
		t.Fatalf("a salted /query: %d %v", code, got.Scores)
	}
	// Dynamo's statuses: 400 for what is not a request, 422 for JSON of
	// the wrong shape (axum's JSON extractor), 404 for no such index.
	for name, tc := range map[string]struct {
		body string
		code int
		says string
	}{
		"routing_group and tenant_id differ": {`{"model_name": "m", "routing_group": "g1", "tenant_id": "g2", "block_hashes": [1]}`, 400, "routing_group"},
		"a hash past 2^64":                   {`{"model_name": "m", "block_hashes": [18446744073709551616]}`, 422, "block_hashes[0]"},
		"a hash below -2^63":                 {`{"model_name": "m", "block_hashes": [-9223372036854775809]}`, 422, "block_hashes[0]"},
		"a fraction":                         {`{"model_name": "m", "block_hashes": [1.5]}`, 422, "block_hashes[0]"},
		"no block_hashes":                    {`{"model_name": "m"}`, 422, "block_hashes: missing"},
		"an empty list":                      {`{"model_name": "m", "routing_group": "g1", "block_hashes": []}`, 200, ""},
		"no such routing group":              {`{"model_name": "m", "routing_group": "g9", "block_hashes": [1]}`, 404, "no indexer for model=m routing_group=g9"},
		"not JSON":                           {`{"model_name": "m", "block_hashes": [1`, 400, "body"},
		"a cache_salt":                       {`{"model_name": "m", "routing_group": "g1", "block_hashes": [1], "cache_salt": "s"}`, 400, "cache_salt"},
		"a null cache_salt":                  {`{"model_name": "m", "routing_group": "g1", "block_hashes": [1], "cache_salt": null}`, 200, ""},
	} {
		var e map[string]any
		if code := post(t, ts.URL+"/query_by_hash", []byte(tc.body), &e); code != tc.code || tc.says != "" && !strings.Contains(fmt.Sprint(e["error"]), tc.says) {
			t.Errorf("%s: %d %v, want %d saying %q", name, code, e["error"], tc.code, tc.says)
		}
	}
	var e map[string]any
	if code := post(t, ts.URL+"/query", []byte(`{"model_name": "m"}`), &e); code != 422 || e["error"] != "token_ids: missing" {
		t.Errorf("a query without token_ids: %d %v, want 422", code, e["error"])
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
