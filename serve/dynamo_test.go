package serve_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/serve"
)

// Shapes of Dynamo's current standalone indexer the service accepts beside
// its own: block hashes of 2^63 and over sent as negative int64s,
// routing_group as the partition (tenant_id its synonym; the two differing
// refused), and /ready.
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
	if code := post(t, ts.URL+"/register", []byte(`{"instance_id": 1, "endpoint": "`+pub.Addr()+`", "model_name": "m", "block_size": 16, "routing_group": "g1"}`), nil); code != http.StatusOK {
		t.Fatalf("register with routing_group: %d", code)
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
	for name, body := range map[string]string{
		"routing_group and tenant_id differ": `{"model_name": "m", "routing_group": "g1", "tenant_id": "g2", "block_hashes": [1]}`,
		"a hash past 2^64":                   `{"model_name": "m", "block_hashes": [18446744073709551616]}`,
		"a hash below -2^63":                 `{"model_name": "m", "block_hashes": [-9223372036854775809]}`,
		"a fraction":                         `{"model_name": "m", "block_hashes": [1.5]}`,
	} {
		if code := post(t, ts.URL+"/query_by_hash", []byte(body), nil); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, code)
		}
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
