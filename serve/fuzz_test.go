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

// apiPaths are the endpoints FuzzAPI sends to: all that take a body but
// the peers' (which reach out to the peer), posted, then those that answer
// JSON to a GET.
var apiPaths = []string{"/register", "/unregister", "/query", "/query_by_hash", "/route", "/requests/%s/first_token", "/requests/%s/complete",
	"/workers", "/peers", "/dump", "/health", "/ready"}

const apiPosts = 7 // apiPaths[:apiPosts] are posted

// FuzzAPI sends any body and query to any endpoint of one service, in the
// order the fuzzer picks, with its method or the other one (which's high
// bit), and holds every answer to the API's promise: a JSON body
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
	send := func(method, path, query string, body []byte) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(method, path, bytes.NewReader(body))
		r.URL.RawQuery = query
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(w, r)
		return w
	}
	engine, _ := json.Marshal(serve.Registration{InstanceID: 1, ModelName: "m", BlockSize: bs, TotalKVBlocks: 1024})
	if w := send(http.MethodPost, "/register", "", engine); w.Code >= 300 {
		f.Fatalf("register: %d %s", w.Code, w.Body)
	}
	prompt, _ := json.Marshal(serve.RouteRequest{TokenIDs: tokens(3*bs+2, 500), ModelName: "m", RequestID: "r1"})
	f.Add(uint8(4), prompt, "", "")
	f.Add(uint8(2), prompt, "", "")
	f.Add(uint8(5), []byte("{}"), "r1", "")
	f.Add(uint8(6), []byte("{}"), "r1", "")
	f.Add(uint8(3), []byte(`{"block_hashes":[1,-2,18446744073709551615],"model_name":"m"}`), "", "")
	f.Add(uint8(0), []byte(`{"instance_id":2,"model_name":"m","block_size":16,"total_kv_blocks":64,"dp_rank":1}`), "", "")
	f.Add(uint8(1), []byte(`{"instance_id":2,"model_name":"m"}`), "", "")
	f.Add(uint8(7), []byte(nil), "", "model_name=m&routing_group=")
	f.Add(uint8(9), []byte(nil), "", "")
	f.Add(uint8(0x80), []byte("{}"), "", "")
	f.Fuzz(func(t *testing.T, which uint8, body []byte, id, query string) {
		i := int(which&0x7f) % len(apiPaths)
		path, method := apiPaths[i], http.MethodGet
		if post := i < apiPosts; post != (which&0x80 != 0) { // the high bit: the method the path does not take
			method = http.MethodPost
		}
		if path == "/register" {
			var reg serve.Registration
			if json.Unmarshal(body, &reg) == nil && (reg.Endpoint != "" || reg.ReplayEndpoint != "") {
				return
			}
		}
		if strings.Contains(path, "%s") {
			if id == "" || id == "." || id == ".." { // the mux redirects these
				return
			}
			path = "/requests/" + url.PathEscape(id) + path[len("/requests/%s"):]
		}
		w := send(method, path, query, body)
		if w.Code == http.StatusInternalServerError || w.Code < 200 || w.Code > 599 {
			t.Fatalf("%s %s?%s %q: %d %s", method, path, query, body, w.Code, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %s?%s %q: %d, a body that is not JSON: %q", method, path, query, body, w.Code, w.Body)
		}
	})
}
