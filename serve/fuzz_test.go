package serve_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/kvradix/kvradix/serve"
)

// apiPaths are the endpoints FuzzAPI posts to: all that take a body but
// the peers' (which reach out to the peer).
var apiPaths = []string{"/register", "/unregister", "/query", "/query_by_hash", "/route", "/requests/%s/first_token", "/requests/%s/complete"}

// FuzzAPI posts any body to any endpoint of one service, in the order the
// fuzzer picks, and holds every answer to the API's promise: a JSON body
// and a status that says whose fault it was (4xx the caller's, 502 and
// 503 the engines' or the moment's), never a panic and never a 500, which
// would mean the caller's input broke the service. The service starts
// with an engine that publishes no events (routed on a model of its
// cache), so that queries and routes reach an index and a scheduler.
// Registrations naming an endpoint are not sent: the service would dial
// whatever the fuzzer wrote.
func FuzzAPI(f *testing.F) {
	svc := serve.New(serve.Config{MaxBodyBytes: 1 << 20, MaxTokens: 1 << 14})
	f.Cleanup(func() { _ = svc.Close() })
	h := svc.Handler()
	send := func(path string, body []byte) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(w, r)
		return w
	}
	engine, _ := json.Marshal(serve.Registration{InstanceID: 1, ModelName: "m", BlockSize: bs, TotalKVBlocks: 1024})
	if w := send("/register", engine); w.Code >= 300 {
		f.Fatalf("register: %d %s", w.Code, w.Body)
	}
	prompt, _ := json.Marshal(serve.RouteRequest{TokenIDs: tokens(3*bs+2, 500), ModelName: "m", RequestID: "r1"})
	f.Add(uint8(4), prompt, "")
	f.Add(uint8(2), prompt, "")
	f.Add(uint8(5), []byte("{}"), "r1")
	f.Add(uint8(6), []byte("{}"), "r1")
	f.Add(uint8(3), []byte(`{"block_hashes":[1,-2,18446744073709551615],"model_name":"m"}`), "")
	f.Add(uint8(0), []byte(`{"instance_id":2,"model_name":"m","block_size":16,"total_kv_blocks":64,"dp_rank":1}`), "")
	f.Add(uint8(1), []byte(`{"instance_id":2,"model_name":"m"}`), "")
	f.Fuzz(func(t *testing.T, which uint8, body []byte, id string) {
		path := apiPaths[int(which)%len(apiPaths)]
		if path == "/register" {
			var reg serve.Registration
			if json.Unmarshal(body, &reg) == nil && (reg.Endpoint != "" || reg.ReplayEndpoint != "") {
				return
			}
		}
		if strings.Contains(path, "%s") {
			if id == "" || id == "." || id == ".." || strings.Contains(id, "/") { // the mux's, not ours: a redirect or its 404
				return
			}
			path = "/requests/" + url.PathEscape(id) + path[len("/requests/%s"):]
		}
		w := send(path, body)
		if w.Code == http.StatusInternalServerError || w.Code < 200 || w.Code > 599 {
			t.Fatalf("POST %s %q: %d %s", path, body, w.Code, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("POST %s %q: %d, a body that is not JSON: %q", path, body, w.Code, w.Body)
		}
	})
}
