package serve_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

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
	waitActive(t, svc, 1)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("a good registration took %v behind three dead ones", took)
	}
	// The good engine is served; the dead ones show as pending.
	status := map[uint64]string{}
	for _, w := range svc.Workers("", "") {
		status[w.InstanceID] = w.Status
	}
	if want := map[uint64]string{1: "active", 100: "pending", 101: "pending", 102: "pending"}; !maps.Equal(status, want) {
		t.Fatalf("workers: %v, want %v", status, want)
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
		if err != nil {
			t.Errorf("a dead engine's registration was refused (it is taken, and dialled in the background): %v", err)
		}
	}
}

// An engine that is not up yet is registered all the same: it shows as
// failed, saying why, while its dials are retried with backoff, and as
// active once it comes up; it does not hold /ready back, and leaving it
// stops the dials.
func TestEngineNotUpYet(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "tcp://" + l.Addr().String()
	l.Close() // nothing listens there now: every dial is refused
	if err := svc.Register(serve.Registration{InstanceID: 3, Endpoint: addr, ModelName: "m", BlockSize: bs}); err != nil {
		t.Fatal(err)
	}
	var w serve.Worker
	testwait.For(t, "the engine shown failed", func() bool {
		ws := svc.Workers("m", "")
		if len(ws) == 1 {
			w = ws[0]
		}
		return w.Status == "failed"
	})
	if l := w.Listeners["0"]; l.Status != "failed" || l.LastError == "" || l.Endpoint != addr || w.Endpoints["0"] != addr {
		t.Fatalf("a failed engine without its listener's error: %+v", w)
	}
	if ok, why := svc.Ready(); !ok {
		t.Fatalf("not ready with only a failed engine: %s", why)
	}
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: addr, Topic: "kv@e@m"})
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	defer pub.Close()
	waitActive(t, svc, 1)
	prompt := tokens(2*bs, 31)
	testwait.For(t, "its blocks", func() bool {
		pub.Publish([]vllm.Event{{Type: vllm.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: prompt, BlockSize: bs, Medium: "GPU"}})
		var got serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
		return got.Scores["3"]["0"] == 2*bs
	})
	// Leaving while failed stops the dials.
	if err := svc.Register(serve.Registration{InstanceID: 4, Endpoint: "tcp://127.0.0.1:1", ModelName: "m", BlockSize: bs}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Unregister(serve.Unregistration{InstanceID: 4, ModelName: "m"}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "no dial left", func() bool { return serve.PendingForTest(svc) == 0 })
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
			sample := fmt.Sprintf(`kvradix_subscriber_events_refused_total{dp_rank="0",instance="%d",model="%s:default",reason="block_size"}`, tc.id, model)
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

// Mooncake's RFC #1527 events, as its master publishes them (an array
// envelope with a timestamp in ms, map events typed by event_type, the
// RFC's names beside vLLM's, media in lower case, block_size nil), through
// the service from a real publisher: a store with tokens is indexed; one
// of another tenant is refused as foreign, one without tokens as
// undecodable, each counted; the registration's type is kept and shown,
// and an unknown type refused.
func TestRFC1527Engine(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	reg := serve.Registration{InstanceID: 9, Endpoint: pub.Addr(), ModelName: "m-rfc", BlockSize: bs, Type: "mooncake"}
	if code := post(t, ts.URL+"/register", reg, nil); code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("register: %d", code)
	}
	bad := reg
	bad.InstanceID, bad.Type = 10, "trtllm"
	var refusal map[string]any
	if code := post(t, ts.URL+"/register", bad, &refusal); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(refusal), "type") {
		t.Fatalf("an unknown type: %d %v", code, refusal)
	}
	prompt, other := tokens(2*bs, 700), tokens(bs, 900)
	stored := func(hashes []any, toks []uint32, tenant string) map[string]any {
		ev := map[string]any{"event_id": uint64(1), "timestamp": uint64(1770000000000), "event_type": "stored", "type": "BlockStored",
			"model_name": "m-rfc", "block_size": nil, "additional_salt": nil, "lora_name": nil, "tenant_id": tenant, "backend_id": "mc-1",
			"medium": "gpu", "dp_rank": uint64(0), "seq_hashes": hashes, "block_hashes": hashes, "base_block_idx": nil, "parent_hash": nil,
			"parent_block_hash": nil, "token_ids": nil}
		if toks != nil {
			ids := make([]any, len(toks))
			for i, x := range toks {
				ids[i] = uint64(x)
			}
			ev["token_ids"] = ids
		}
		return ev
	}
	batch := func(events ...map[string]any) []byte {
		evs := make([]any, len(events))
		for i, ev := range events {
			evs[i] = ev
		}
		b, err := msgp.AppendIntf(nil, []any{uint64(1770000000000), evs, uint64(0)})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	testwait.For(t, "the RFC #1527 store indexed", func() bool {
		if _, err := pub.PublishPayload(batch(stored([]any{uint64(31), uint64(32)}, prompt, "default"))); err != nil {
			t.Fatal(err)
		}
		var got serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m-rfc"}, &got)
		return got.Scores["9"]["0"] == 2*bs
	})
	if _, err := pub.PublishPayload(batch(stored([]any{uint64(41)}, other, "tenant-b"), stored([]any{uint64(42)}, nil, "default"))); err != nil {
		t.Fatal(err)
	}
	for _, reason := range []string{"foreign", "undecodable"} {
		sample := fmt.Sprintf(`kvradix_subscriber_events_refused_total{dp_rank="0",instance="9",model="m-rfc:default",reason="%s"}`, reason)
		testwait.For(t, reason+" counted", func() bool { return metric(t, ts.URL, sample) == 1 })
	}
	var got serve.Scores
	post(t, ts.URL+"/query", serve.Query{TokenIDs: other, ModelName: "m-rfc"}, &got)
	if len(got.Scores) != 0 {
		t.Fatalf("another tenant's block matched: %v", got.Scores)
	}
	var workers []serve.Worker
	get(t, ts.URL+"/workers", &workers)
	if len(workers) != 1 || workers[0].Type != "mooncake" {
		t.Fatalf("workers %+v, want one of type mooncake", workers)
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

// stateWithTwoModels saves a state holding two models' indexes (two
// snapshots) and their engines, and returns its directory.
func stateWithTwoModels(t *testing.T) string {
	dir := t.TempDir()
	svc := serve.New(serve.Config{StateDir: dir})
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	for i, model := range []string{"a", "b"} {
		pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		if err := svc.Register(serve.Registration{InstanceID: uint64(10 + i), Endpoint: pub.Addr(), ModelName: model, BlockSize: bs}); err != nil {
			t.Fatal(err)
		}
		prompt := tokens(bs*(1+i), 300)
		hashes := []uint64{uint64(50 + i), uint64(60 + i)}[:1+i]
		testwait.For(t, "model "+model+" indexed", func() bool {
			pub.Publish([]vllm.Event{{Type: vllm.BlockStored, BlockHashes: hashes, TokenIDs: prompt, BlockSize: bs, Medium: "GPU"}})
			var got serve.Scores
			post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: model}, &got)
			return got.Scores[fmt.Sprint(10+i)]["0"] == uint64(len(prompt))
		})
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// copyDir copies the state directory's files.
func copyDir(t *testing.T, from string) string {
	to := t.TempDir()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// recoverFrom starts a service on dir and recovers, returning what it
// brought back and its error; the service is closed.
func recoverFrom(t *testing.T, dir string) (serve.Recovered, error) {
	svc := serve.New(serve.Config{StateDir: dir})
	defer svc.Close()
	return svc.Recover()
}

// The state is checked whole: of a single-bit flip in every byte of
// state.json, none loads (283 of 1,023 loaded as another model, tenant, instance, resume
// point or file); two snapshots swapped are refused (they loaded under
// each other's model); a refused state is set aside where no save deletes
// it (the next periodic save did), and snapshots with no state.json are
// reported, not silently dropped.
func TestStateIsCheckedWhole(t *testing.T) {
	good := stateWithTwoModels(t)
	if rec, err := recoverFrom(t, copyDir(t, good)); err != nil || rec.Indexes != 2 {
		t.Fatalf("the good state: %+v %v", rec, err)
	}
	state, err := os.ReadFile(filepath.Join(good, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := copyDir(t, good)
	for i := range state {
		flipped := bytes.Clone(state)
		flipped[i] ^= 1 << (i % 8) // one bit of every byte, each bit in turn
		if err := os.WriteFile(filepath.Join(dir, "state.json"), flipped, 0o600); err != nil {
			t.Fatal(err)
		}
		if rec, err := recoverFrom(t, dir); err == nil || rec.Indexes > 0 {
			t.Fatalf("bit %d of state.json flipped: recovered %+v", i, rec)
		}
		// The refused state went aside: put the snapshots back.
		aside, _ := filepath.Glob(filepath.Join(dir, "refused-*"))
		if len(aside) != 1 {
			t.Fatalf("bit %d of state.json flipped: set aside in %v", i, aside)
		}
		refused, _ := filepath.Glob(filepath.Join(aside[0], "index-*"))
		for _, f := range refused {
			if err := os.Rename(f, filepath.Join(dir, filepath.Base(f))); err != nil {
				t.Fatal(err)
			}
		}
		os.RemoveAll(aside[0])
	}

	swapped := copyDir(t, good)
	snaps, _ := filepath.Glob(filepath.Join(swapped, "index-*.snap"))
	if len(snaps) != 2 {
		t.Fatalf("snapshots %v", snaps)
	}
	tmp := snaps[0] + ".x"
	for _, mv := range [][2]string{{snaps[0], tmp}, {snaps[1], snaps[0]}, {tmp, snaps[1]}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if rec, err := recoverFrom(t, swapped); err == nil || rec.Indexes > 0 {
		t.Fatalf("swapped snapshots: recovered %+v", rec)
	}

	// Refused, then saved over: the refused files stay where the error
	// said.
	bad := copyDir(t, good)
	if err := os.WriteFile(filepath.Join(bad, "state.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc := serve.New(serve.Config{StateDir: bad})
	_, err = svc.Recover()
	if err == nil || !strings.Contains(err.Error(), "kept in") {
		t.Fatalf("a broken state.json: %v, want it refused and set aside", err)
	}
	if err := svc.Save(t.Context()); err != nil {
		t.Fatal(err)
	}
	svc.Close()
	if kept, _ := filepath.Glob(filepath.Join(bad, "refused-*", "index-*.snap")); len(kept) != 2 {
		t.Fatalf("after a save, the refused snapshots kept: %v", kept)
	}

	orphans := copyDir(t, good)
	os.Remove(filepath.Join(orphans, "state.json"))
	if _, err := recoverFrom(t, orphans); err == nil || !strings.Contains(err.Error(), "without a state.json") {
		t.Fatalf("snapshots without state.json: %v, want a warning", err)
	}
}

// A request routed to an instance that then leaves is freed with it: its
// id may be used again at once (it was refused, 409 "in flight", until its
// TTL), and completing it says it is gone.
func TestRoutesLeaveWithTheirInstance(t *testing.T) {
	svc := serve.New(serve.Config{RequestTTL: time.Hour})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	registerPublishers(t, svc, 2)
	prompt := tokens(2*bs, 700)
	var stays, a serve.RouteAnswer
	if code := post(t, ts.URL+"/route", serve.RouteRequest{TokenIDs: prompt, ModelName: "m", RequestID: "r0"}, &stays); code != 200 {
		t.Fatalf("route: %d", code)
	}
	if code := post(t, ts.URL+"/route", serve.RouteRequest{TokenIDs: prompt, ModelName: "m", RequestID: "r1"}, &a); code != 200 || a.InstanceID == stays.InstanceID {
		t.Fatalf("route: %d, to %d beside r0's %d (the load should spread them)", code, a.InstanceID, stays.InstanceID)
	}
	if code := post(t, ts.URL+"/unregister", serve.Unregistration{InstanceID: a.InstanceID, ModelName: "m"}, nil); code != 200 {
		t.Fatalf("unregister: %d", code)
	}
	if code := post(t, ts.URL+"/requests/r1/complete", []byte("{}"), nil); code != 404 {
		t.Fatalf("completing a request whose instance left: %d, want 404", code)
	}
	// The id is free again; the instance left still carries r0 (its
	// blocks and its count).
	var again serve.RouteAnswer
	if code := post(t, ts.URL+"/route", serve.RouteRequest{TokenIDs: prompt, ModelName: "m", RequestID: "r1"}, &again); code != 200 || again.InstanceID != stays.InstanceID {
		t.Fatalf("the id again: %d %+v", code, again)
	}
	if again.ActiveRequests != 1 || again.DecodeBlocks != 2 {
		t.Fatalf("r0 not carried over: %+v", again.Candidate)
	}
	if code := post(t, ts.URL+"/requests/r0/complete", []byte("{}"), nil); code != 200 {
		t.Fatalf("completing r0: %d", code)
	}
}

// Request ids are kept exactly: a canonical UUID, its upper-case and
// braced spellings and any other string are four requests, each released
// by its own id only; an instance registering while they are in flight leaves their
// load where it was.
func TestRouteIDsAndAJoiningInstance(t *testing.T) {
	svc := serve.New(serve.Config{RequestTTL: time.Hour})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	registerPublishers(t, svc, 1)
	prompt := tokens(2*bs, 900)
	lower := "0b7f3c52-8d4e-4a1b-9c6f-2e5d8a7b1c30"
	ids := []string{lower, strings.ToUpper(lower), "{" + lower + "}", "req/1"}
	for i, id := range ids {
		var a serve.RouteAnswer
		if code := post(t, ts.URL+"/route", serve.RouteRequest{TokenIDs: prompt, ModelName: "m", RequestID: id}, &a); code != 200 || a.RequestID != id || a.ActiveRequests != i {
			t.Fatalf("route %q: %d %+v (want %d active before it)", id, code, a, i)
		}
	}
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := svc.Register(serve.Registration{InstanceID: 2, Endpoint: pub.Addr(), ModelName: "m", BlockSize: bs}); err != nil {
		t.Fatal(err)
	}
	waitActive(t, svc, 2)
	var a serve.RouteAnswer
	if code := post(t, ts.URL+"/route", serve.RouteRequest{TokenIDs: prompt, ModelName: "m"}, &a); code != 200 || a.InstanceID != 2 {
		t.Fatalf("route after instance 2 joined: %d %+v", code, a)
	}
	for _, c := range a.Candidates {
		if want := map[uint64]int{1: len(ids), 2: 0}[c.InstanceID]; c.ActiveRequests != want {
			t.Fatalf("instance %d: %d active, want %d", c.InstanceID, c.ActiveRequests, want)
		}
	}
	for _, id := range append(ids, a.RequestID) {
		path := ts.URL + "/requests/" + url.PathEscape(id) + "/complete"
		if code := post(t, path, []byte("{}"), nil); code != 200 {
			t.Fatalf("complete %q: %d", id, code)
		}
		if code := post(t, path, []byte("{}"), nil); code != 404 {
			t.Fatalf("complete %q twice: %d", id, code)
		}
	}
}

// With a token, every endpoint that changes state requires it, /route and
// the releases too (anyone could free another client's request, squat an
// id or pin load); reads stay open. Without one, a browser page still
// cannot drive the service: a POST that is not JSON is refused (415), and
// so is a request the browser marks cross-origin (403).
func TestOpenDoorsAreShut(t *testing.T) {
	svc := serve.New(serve.Config{Token: "s3cret"})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	send := func(path, body, ctype, auth string, hdr ...string) int {
		req, _ := http.NewRequest("POST", ts.URL+path, strings.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const js = "application/json"
	for _, tc := range []struct {
		name, path, ctype, auth string
		hdr                     []string
		want                    int
	}{
		{"route without the token", "/route", js, "", nil, http.StatusUnauthorized},
		{"route with a wrong token", "/route", js, "nope", nil, http.StatusUnauthorized},
		{"route with the token", "/route", js, "s3cret", nil, http.StatusBadRequest}, // through: neither tokens nor hashes
		{"complete without the token", "/requests/x/complete", js, "", nil, http.StatusUnauthorized},
		{"first_token without the token", "/requests/x/first_token", js, "", nil, http.StatusUnauthorized},
		{"complete with the token", "/requests/x/complete", js, "s3cret", nil, http.StatusNotFound},
		{"a query stays open", "/query", js, "", nil, http.StatusUnprocessableEntity}, // through: no token_ids
		{"a text/plain register", "/register", "text/plain", "s3cret", nil, http.StatusUnsupportedMediaType},
		{"a form query", "/query", "application/x-www-form-urlencoded", "", nil, http.StatusUnsupportedMediaType},
		{"no content type", "/query", "", "", nil, http.StatusUnsupportedMediaType},
		{"JSON with a charset", "/query", "application/json; charset=utf-8", "", nil, http.StatusUnprocessableEntity},
		{"a cross-site browser request", "/register", js, "s3cret", []string{"Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"a foreign origin", "/query", js, "", []string{"Origin", "http://evil.example"}, http.StatusForbidden},
	} {
		if got := send(tc.path, "{}", tc.ctype, tc.auth, tc.hdr...); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	var workers []serve.Worker
	if code := get(t, ts.URL+"/workers", &workers); code != http.StatusOK {
		t.Fatalf("a read without the token: %d", code)
	}
}

// A request the API does not take is answered as every error is, in JSON
// naming what was wrong: a path it does not have (404), a method a path
// does not take (405, with Allow), and a query an endpoint that answers
// data cannot honour (400): a misspelt filter used to list everything.
// Probes take any query.
func TestWhatTheAPIDoesNotTake(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	for i, group := range []string{"g", "h"} {
		reg := serve.Registration{InstanceID: uint64(i + 1), ModelName: "m", BlockSize: 16, RoutingGroup: group, TotalKVBlocks: 64}
		if code := post(t, ts.URL+"/register", reg, nil); code != http.StatusCreated {
			t.Fatalf("register %s: %d", group, code)
		}
	}
	for _, tc := range []struct {
		method, path string
		want         int
		says, allow  string
	}{
		{"GET", "/nope", http.StatusNotFound, "no endpoint GET /nope", ""},
		{"GET", "/workers/", http.StatusNotFound, "no endpoint GET /workers/", ""},
		{"GET", "/route", http.StatusMethodNotAllowed, "GET /route: method not allowed", "POST"},
		{"DELETE", "/workers", http.StatusMethodNotAllowed, "DELETE /workers: method not allowed", "GET, HEAD"},
		{"POST", "/health", http.StatusMethodNotAllowed, "POST /health: method not allowed", "GET, HEAD"},
		{"GET", "/requests/r1/complete", http.StatusMethodNotAllowed, "method not allowed", "POST"},
		{"GET", "/workers?model=m", http.StatusBadRequest, `unknown parameter "model"`, ""},
		{"GET", "/workers?model_name=m&model_name=n", http.StatusBadRequest, `"model_name" given 2 times`, ""},
		{"GET", "/workers?model_name=%zz", http.StatusBadRequest, "invalid URL escape", ""},
		{"GET", "/workers?routing_group=g&tenant_id=h", http.StatusBadRequest, "differ", ""},
		{"GET", "/dump?model_name=m", http.StatusBadRequest, `"model_name": this endpoint takes none`, ""},
		{"GET", "/peers?all=1", http.StatusBadRequest, "takes none", ""},
		{"POST", "/query?model_name=m", http.StatusBadRequest, "takes none", ""},
	} {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var answer struct{ Error string }
		err = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		name := tc.method + " " + tc.path
		switch {
		case err != nil:
			t.Errorf("%s: %d, not JSON: %v", name, resp.StatusCode, err)
		case resp.StatusCode != tc.want || !strings.Contains(answer.Error, tc.says):
			t.Errorf("%s: %d %q, want %d saying %q", name, resp.StatusCode, answer.Error, tc.want, tc.says)
		case resp.Header.Get("Allow") != tc.allow:
			t.Errorf("%s: Allow %q, want %q", name, resp.Header.Get("Allow"), tc.allow)
		}
	}
	for _, tc := range []struct {
		query string
		want  []uint64
	}{
		{"", []uint64{1, 2}},
		{"?model_name=m&tenant_id=h", []uint64{2}},
		{"?routing_group=g&tenant_id=g", []uint64{1}},
	} {
		var workers []serve.Worker
		if code := get(t, ts.URL+"/workers"+tc.query, &workers); code != http.StatusOK {
			t.Fatalf("/workers%s: %d", tc.query, code)
		}
		var ids []uint64
		for _, w := range workers {
			ids = append(ids, w.InstanceID)
		}
		if slices.Sort(ids); !slices.Equal(ids, tc.want) {
			t.Errorf("/workers%s: instances %v, want %v", tc.query, ids, tc.want)
		}
	}
	var health map[string]string
	if code := get(t, ts.URL+"/health?probe=1", &health); code != http.StatusOK {
		t.Errorf("/health with a query: %d", code)
	}
}

// Registrations are bounded: indexes (Config.MaxIndexes: a few MB each,
// one per new model name a client makes up), engines
// (Config.MaxInstances) and peers (MaxPeers); past a bound the API
// answers 503 naming it, and what leaves makes room again.
func TestRegistrationsBounded(t *testing.T) {
	svc := serve.New(serve.Config{MaxIndexes: 2, MaxInstances: 3})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	register := func(model string, id uint64) (int, string) {
		t.Helper()
		var e struct{ Error string }
		code := post(t, ts.URL+"/register", serve.Registration{InstanceID: id, ModelName: model, BlockSize: bs, TotalKVBlocks: 64}, &e)
		return code, e.Error
	}
	for _, step := range []struct {
		model string
		id    uint64
		code  int
		says  string
	}{
		{"m1", 1, 201, ""},
		{"m2", 1, 201, ""},
		{"m3", 1, 503, "2 indexes (models and routing groups), at most 2"},
		{"m1", 2, 201, ""},
		{"m1", 3, 503, "3 engines (instance ranks) registered, at most 3"},
	} {
		if code, why := register(step.model, step.id); code != step.code || !strings.Contains(why, step.says) {
			t.Fatalf("register %s/%d: %d %q, want %d saying %q", step.model, step.id, code, why, step.code, step.says)
		}
	}
	if code := post(t, ts.URL+"/unregister", serve.Unregistration{InstanceID: 1, ModelName: "m2"}, nil); code != http.StatusOK {
		t.Fatalf("unregister: %d", code)
	}
	if code, why := register("m3", 1); code != http.StatusCreated {
		t.Fatalf("a registration after one left: %d %q", code, why)
	}
	for i := range serve.MaxPeers + 1 {
		want := http.StatusCreated
		if i == serve.MaxPeers {
			want = http.StatusServiceUnavailable
		}
		if code := post(t, ts.URL+"/register_peer", serve.Peer{URL: fmt.Sprintf("http://peer%d:1", i)}, nil); code != want {
			t.Fatalf("peer %d: %d, want %d", i, code, want)
		}
	}
	if code := post(t, ts.URL+"/register_peer", serve.Peer{URL: "http://peer0:1"}, nil); code != http.StatusCreated {
		t.Fatalf("a peer registered again: %d, want %d (kept once)", code, http.StatusCreated)
	}
}

// Distinct (model, tenant, instance) never share a key or a label: one
// instance id in two models made /metrics answer 500 (two series alike)
// and the names a:b/c and a/b:c one /dump key; a name with NUL shared a
// bus stream. Such names are refused; the rest are labelled apart.
func TestNamesKeptApart(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	for _, model := range []string{"a", "b"} {
		pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		if err := svc.Register(serve.Registration{InstanceID: 1, Endpoint: pub.Addr(), ModelName: model, BlockSize: bs}); err != nil {
			t.Fatal(err)
		}
	}
	waitActive(t, svc, 2)
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(text), `kvradix_subscriber_down{dp_rank="0",instance="1",model="b:default"}`) {
		t.Fatalf("/metrics with one instance id in two models: %d", resp.StatusCode)
	}
	for _, reg := range []serve.Registration{
		{InstanceID: 2, Endpoint: "tcp://x:1", ModelName: "a\x00b", BlockSize: bs},
		{InstanceID: 2, Endpoint: "tcp://x:1", ModelName: "a", TenantID: "b:c", BlockSize: bs},
		{InstanceID: 2, Endpoint: "tcp://x:1", ModelName: "a", TenantID: "t\x00", BlockSize: bs},
		{InstanceID: 2, Endpoint: "tcp://x:1", ModelName: "a\xff", BlockSize: bs}, // JSON would answer it as "a\ufffd", another model
		{InstanceID: 2, Endpoint: "tcp://x:1", ModelName: "a", TenantID: "\xfe", BlockSize: bs},
	} {
		if err := svc.Register(reg); !errors.Is(err, serve.ErrInvalid) {
			t.Errorf("model %q tenant %q: %v, want refused", reg.ModelName, reg.TenantID, err)
		}
	}
}
