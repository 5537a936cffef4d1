package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/perf/benchfmt"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/openloop"
)

var indexerSmall = []string{"-synth", "-synth-requests", "200", "-synth-rate", "100", "-workers", "50", "-blocks", "1024", "-quiet"}

// indexerLines runs loadgen indexer with -json and reads its lines.
func indexerLines(t *testing.T, args ...string) []*openloop.Result {
	t.Helper()
	out, _, err := runArgs(t, append([]string{"indexer", "-json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := readResults(strings.NewReader(out))
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return rs
}

// -json writes a line per run, Dynamo's result JSON with kvradix's keys.
func TestIndexerJSON(t *testing.T) {
	rs := indexerLines(t, append([]string{"-duration", "300ms", "-lanes", "1,2"}, indexerSmall...)...)
	if len(rs) != 5 {
		t.Fatalf("%d results, want single + two pools + two compressed pools", len(rs))
	}
	if rs[0].Index != "single" || rs[2].Index != "pool" || rs[2].Lanes != 2 || rs[4].Index != "compressed" || rs[4].Lanes != 2 || rs[4].Backend != "kvradix-compressed" {
		t.Fatalf("%+v", rs)
	}
	for _, r := range rs {
		if r.RejectedEvents != 0 || r.Pairs <= 0 || r.BytesPerPair <= 0 || r.Provenance == nil || r.TotalBlockOps == 0 || r.QueryService.P50 == 0 {
			t.Errorf("%+v", r)
		}
	}
}

// The bench format parses as Go benchmark results, as benchstat reads them.
func TestIndexerBenchFormat(t *testing.T) {
	out, _, err := runArgs(t, append([]string{"indexer", "-format=bench", "-duration", "200ms", "-sweep", "-sweep-steps", "2"}, indexerSmall...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := benchfmt.NewReader(strings.NewReader(out), "loadgen")
	names := map[string]bool{}
	for r.Scan() {
		switch rec := r.Result().(type) {
		case *benchfmt.Result:
			names[string(rec.Name)] = true
			ns, _ := rec.Value("sec/op")
			ops, _ := rec.Value("block-ops/s")
			if ns <= 0 || ops <= 0 {
				t.Errorf("%s: %v", rec.Name, rec.Values)
			}
		case *benchfmt.SyntaxError:
			t.Fatalf("benchstat would reject: %v", rec)
		}
	}
	if !names["Indexer/impl=single"] || !names["Indexer/impl=pool/lanes=2"] {
		t.Fatalf("names %v in\n%s", names, out)
	}
}

func TestIndexerInterrupted(t *testing.T) {
	var out, errb bytes.Buffer
	stop := make(chan os.Signal, 1)
	go func() { time.Sleep(150 * time.Millisecond); stop <- os.Interrupt }()
	err := run(append([]string{"indexer", "-duration", "5s"}, indexerSmall...), &out, &errb, stop)
	if err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("error %v", err)
	}
	if !strings.Contains(out.String(), "impl=single") || !strings.Contains(out.String(), "interrupted") {
		t.Fatalf("no partial table:\n%s", out.String())
	}
}

func TestIndexerBadFlags(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.jsonl")
	if err := os.WriteFile(empty, []byte("\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"indexer", "-duration", "11m"}, "-duration"},
		{[]string{"indexer", "-dup", "0"}, "-dup"},
		{[]string{"indexer", "-compare", "single,btree"}, "btree"},
		{[]string{"indexer", "-lanes", "0"}, "-lanes"},
		{[]string{"indexer", "-format", "xml"}, "-format"},
		{[]string{"indexer", "-trace", "/nonexistent/trace.jsonl"}, "no such file"},
		{[]string{"router", "-rate", "0"}, "-rate"},
		{[]string{"router", "-modes", "kv,magic"}, "magic"},
		{[]string{"router", "-modes", "kv,round_robin,kv"}, "twice"},
		{[]string{"indexer", "-compare", "compressed,compressed"}, "twice"},
		{[]string{"indexer", "-lanes", "2,2"}, "twice"},
		{[]string{"replay", "-routers", "kv,kv"}, "twice"},
		{[]string{"holes", "-compare", "pool,pool"}, "-compare: index \"pool\" given twice"},
		{[]string{"router", "-rate", "Inf"}, "-rate"},
		{[]string{"router", "-rate", "1e300"}, "-rate"},
		{[]string{"router", "-rate", "0.01", "-duration", "10s"}, "offers no request"},
		{[]string{"indexer", "-synth", "-synth-rate", "Inf"}, "rate"},
		{[]string{"indexer", "-synth", "-synth-requests", "0"}, "requests"},
		{[]string{"indexer", "-trace", empty}, "no request"},
		{[]string{"replay", "-trace", empty}, "no request"},
		{[]string{"replay", "-speedup", "Inf"}, "speedup"},
		{[]string{"router", "-inflight", "0"}, "-inflight"},
		{[]string{"router", "-inflight", "8", "-clients", "16"}, "-inflight"},
		// each of these crashed loadgen, out of memory or in makeslice
		{[]string{"indexer", "-blocks", "99999999999"}, "blocks"},
		{[]string{"indexer", "-workers", "99999999999"}, "-workers"},
		{[]string{"indexer", "-dup", "99999999999"}, "-dup"},
		{[]string{"indexer", "-lanes", "99999999999"}, "-lanes"},
		{[]string{"memory", "-dup", "99999999999"}, "-dup"},
		{[]string{"replay", "-blocks", "99999999999"}, "blocks"},
		{[]string{"replay", "-lanes", "99999999999"}, "lanes"},
		{[]string{"cluster", "-blocks", "99999999999"}, "blocks"},
		{[]string{"ingest", "-batch", "99999999999"}, "-batch"},
		{[]string{"ingest", "-events", "99999999999"}, "-events"},
		{[]string{"ingest", "-lanes", "99999999999"}, "-lanes"},
		{[]string{"serve", "-clients", "99999999999"}, "-clients"},
		{[]string{"serve", "-engines", "99999999999"}, "-engines"},
		{[]string{"serve", "-stretch", "99999999999"}, "-stretch"},
		{[]string{"serve", "-engine-blocks", "99999999999"}, "-engine-blocks"},
		{[]string{"serve", "-request-timeout", "0s"}, "-request-timeout"},
		{[]string{"serve", "-url", "localhost:8090"}, "-url"}, // refused by its first request, not naming the flag
	} {
		_, _, err := runArgs(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.msg) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want one line about %q", tc.args, err, tc.msg)
		}
	}
}

// A profile's path is refused before the run (an indexer's heap profile
// was written after it, and a bad path lost its results), a run that
// fails leaves no empty profile behind, and one that succeeds writes both.
func TestProfiles(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "missing", "p")
	for _, args := range [][]string{
		{"indexer", "-cpuprofile", bad},
		{"indexer", "-memprofile", bad},
		{"ingest", "-cpuprofile", bad},
		{"ingest", "-memprofile", bad},
		{"replay", "-cpuprofile", bad},
		{"serve", "-cpuprofile", bad},
		{"serve", "-sample", bad},
	} {
		stdout, stderr, err := runArgs(t, args...)
		if err == nil || !strings.Contains(err.Error(), bad) || stdout+stderr != "" {
			t.Errorf("%v: %v after %q, want the path refused before any work", args, err, stdout+stderr)
		}
	}
	cpu, mem := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	if _, _, err := runArgs(t, "indexer", "-corpus", filepath.Join(dir, "none"), "-cpuprofile", cpu, "-memprofile", mem); err == nil {
		t.Fatal("a missing corpus accepted")
	}
	for _, p := range []string{cpu, mem} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after a failed run: %v, want none", p, err)
		}
	}
	args := append([]string{"indexer", "-duration", "200ms", "-compare", "compressed", "-cpuprofile", cpu, "-memprofile", mem}, indexerSmall...)
	if _, _, err := runArgs(t, args...); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{cpu, mem} {
		if b, err := os.ReadFile(p); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s: %v, %d bytes, want a profile (gzip)", p, err, len(b))
		}
	}
}

func TestIndexerDup(t *testing.T) {
	a := indexerLines(t, append([]string{"-duration", "200ms", "-compare", "pool"}, indexerSmall...)...)
	b := indexerLines(t, append([]string{"-duration", "200ms", "-compare", "pool", "-dup", "2"}, indexerSmall...)...)
	if b[0].TotalLogicalOps != 2*a[0].TotalLogicalOps || b[0].Pairs != 2*a[0].Pairs || b[0].Provenance.TraceDuplicationFactor != 2 {
		t.Fatalf("dup 2: %+v vs %+v (want disjoint copies: twice the ops and pairs)", b[0], a[0])
	}
}

func TestRouterCommand(t *testing.T) {
	out, _, err := runArgs(t, "router", "-json", "-synth", "-synth-requests", "100", "-rate", "500", "-duration", "300ms", "-workers", "8", "-clients", "4", "-inflight", "16")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []routerResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 || rep.Results[1].Mode != "kv" || rep.Results[1].Events != 150 || rep.Results[1].Rejected != 0 {
		t.Fatalf("%+v", rep.Results)
	}
	if rep.Results[0].AchievedRPS <= 0 || rep.Results[1].DecisionUs.P50 <= 0 {
		t.Fatalf("%+v", rep.Results)
	}
}

func TestIngestCommand(t *testing.T) {
	limit := debug.SetMemoryLimit(-1)
	out, _, err := runArgs(t, "ingest", "-json", "-engines", "2", "-events", "1600", "-blocks-per-event", "8", "-drop", "0.05")
	if err != nil {
		t.Fatal(err)
	}
	var res ingestResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if after := debug.SetMemoryLimit(-1); after != limit {
		t.Fatalf("the run left the memory limit at %d, was %d", after, limit)
	}
	if res.PayloadMB <= 0 || res.MemLimitMiB != 2*int(math.Round(res.PayloadMB*1e6))>>20+64 || (runtime.GOOS == "linux" && res.PeakRSSMB <= 0) {
		t.Fatalf("memory: %v MB encoded, limit %d MiB, peak RSS %v MB", res.PayloadMB, res.MemLimitMiB, res.PeakRSSMB)
	}
	if !res.IndexEqual || res.Rejected != 0 || res.Restarts != 1 || res.GapsLost != 0 || res.GapsRepaired != res.GapsFound || res.EventsS <= 0 {
		t.Fatalf("%+v", res)
	}
	if res.DroppedBatches > 0 && res.GapsFound == 0 {
		t.Fatalf("%d batches dropped but no gap found", res.DroppedBatches)
	}
}

// -faults: a disconnect, a stalled replay socket, a forged sequence and a
// peer announcing a 2^62-byte frame, all during the run; the index still
// equals the direct build and every fault is counted.
func TestIngestFaults(t *testing.T) {
	out, _, err := runArgs(t, "ingest", "-json", "-faults", "-engines", "4", "-events", "4000", "-blocks-per-event", "8")
	if err != nil {
		t.Fatal(err)
	}
	var res ingestResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if !res.IndexEqual || !res.Faults || res.Disconnects == 0 || res.FramesRefused == 0 || res.SuspectSeqs != 1 || res.GapsLost != 0 || res.BatchesLost != 0 || res.Rejected != 0 {
		t.Fatalf("%+v", res)
	}
}

// loadgen cluster: one router, replicas sharing load and replicas not, on
// an embedded NATS server; every replica's index equals the reference.
func TestClusterCommand(t *testing.T) {
	out, _, err := runArgs(t, "cluster", "-json", "-replicas", "2", "-synth", "-synth-requests", "150", "-synth-rate", "30", "-workers", "4", "-blocks", "2048")
	if err != nil {
		t.Fatal(err)
	}
	var rep clusterReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Results) != 3 || rep.Results[0].Mode != "single" || rep.Results[1].Mode != "shared" || rep.Results[2].Mode != "unshared" ||
		rep.Results[1].Replicas != 2 || rep.CatchUpMs <= 0 || rep.CatchUpPairs <= 0 {
		t.Fatalf("%+v", rep)
	}
	for _, r := range rep.Results {
		if !r.IndexesEqual || r.ReuseRatio <= 0 || r.TTFTMs.Mean <= 0 || r.EventLagMs.P99 <= 0 {
			t.Fatalf("%+v", r)
		}
	}
}

// loadgen cluster -faults: a replica killed and restarted from a snapshot,
// the embedded server restarted; every replica's index still equals the
// reference.
func TestClusterFaults(t *testing.T) {
	out, _, err := runArgs(t, "cluster", "-json", "-faults", "-replicas", "2", "-synth", "-synth-requests", "150", "-synth-rate", "30", "-workers", "4", "-blocks", "2048")
	if err != nil {
		t.Fatal(err)
	}
	var rep clusterReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !rep.Faults || len(rep.Results) != 3 {
		t.Fatalf("%+v", rep)
	}
	for _, r := range rep.Results {
		wantReplica := 1
		if r.Mode == "single" {
			wantReplica = 0
		}
		if !r.IndexesEqual || r.ServerRestarts != 1 || r.ReplicaRestarts != wantReplica || r.SnapshotsRefused != wantReplica || !r.HostileRefused {
			t.Fatalf("%+v", r)
		}
		if r.StreamResets != r.Replicas {
			t.Fatalf("%s: %d stream resets, want every one of its %d replicas", r.Mode, r.StreamResets, r.Replicas)
		}
		if r.Mode == "shared" && r.ForgeriesDropped < 20 {
			t.Fatalf("%s: %d forgeries dropped, want the 20 admissions at least", r.Mode, r.ForgeriesDropped)
		}
	}
}

// loadgen serve: engines serving a workload register over HTTP and
// publish over ZeroMQ into the in-process service while clients query its
// prompts; its /dump ends equal to the events published, with no failed
// query, a batch per request, and queries matching what engines hold.
func TestServeCommand(t *testing.T) {
	out, _, err := runArgs(t, "serve", "-json", "-engines", "2", "-synth", "-synth-requests", "300", "-duration", "500ms", "-rate", "200", "-clients", "4", "-engine-blocks", "200", "-token", "t0k") // the in-process service is started with the token
	if err != nil {
		t.Fatal(err)
	}
	var res serveResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !res.DumpEqual || res.Errors != 0 || res.Queries == 0 || res.Requests != 300 || res.Batches != 300 || !(res.MatchedPct > 0 && res.MatchedPct <= 100) || res.HashesPerQ == 0 {
		t.Fatalf("%+v", res)
	}
}

// loadgen serve against a service (-url) that does not answer: a request
// taking longer than -request-timeout fails the run, naming what it
// asked, and an interrupt stops a wait for engines the service never
// subscribes to, instead of its 30 s.
func TestServeAgainstAServiceThatDoesNotAnswer(t *testing.T) {
	start := func(url string, stop chan os.Signal) <-chan error {
		done := make(chan error, 1)
		go func() {
			var out, errb bytes.Buffer
			done <- run([]string{"serve", "-url", url, "-request-timeout", "300ms", "-engines", "1", "-synth", "-synth-requests", "10", "-duration", "100ms"}, &out, &errb, stop)
		}()
		return done
	}
	wait := func(t *testing.T, done <-chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("loadgen serve still running 20 s on")
			return nil
		}
	}
	t.Run("silent", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() { // accepts and never answers
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		err = wait(t, start("http://"+ln.Addr().String(), make(chan os.Signal)))
		if err == nil || !strings.Contains(err.Error(), "register engine 0") || !strings.Contains(err.Error(), "Timeout") {
			t.Fatalf("error %v, want the registration's timeout", err)
		}
	})
	t.Run("never-active", func(t *testing.T) {
		polled := make(chan struct{})
		var once sync.Once
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/register" {
				w.WriteHeader(http.StatusCreated)
				return
			}
			once.Do(func() { close(polled) })
			fmt.Fprint(w, `[{"instance_id":0,"status":"registered"}]`) // GET /workers: never active
		}))
		defer srv.Close()
		stop := make(chan os.Signal, 1)
		done := start(srv.URL, stop)
		select { // the interrupt comes while loadgen waits for the engine
		case <-polled:
		case <-time.After(20 * time.Second):
			t.Fatal("no GET /workers in 20 s")
		}
		stop <- os.Interrupt
		if err := wait(t, done); !errors.Is(err, errInterrupted) {
			t.Fatalf("error %v, want interrupted", err)
		}
	})
}

// `loadgen corpus` writes the indexer's corpus in SMGMCK01, the same bytes
// for the same flags; `indexer -corpus` replays it with the same counts;
// a damaged corpus is refused naming the offset.
func TestCorpusFile(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.smg"), filepath.Join(dir, "b.smg")
	for _, out := range []string{a, b} {
		if _, _, err := runArgs(t, append([]string{"corpus", "-out", out, "-quiet"}, indexerSmall...)...); err != nil {
			t.Fatal(err)
		}
	}
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if len(da) == 0 || !bytes.Equal(da, db) {
		t.Fatalf("two corpora of the same flags differ (%d and %d bytes)", len(da), len(db))
	}
	built := indexerLines(t, append([]string{"-duration", "300ms", "-compare", "compressed"}, indexerSmall...)...)
	replayed := indexerLines(t, "-duration", "300ms", "-compare", "compressed", "-corpus", a)
	counts := func(r *openloop.Result) [3]uint64 { return [3]uint64{r.TotalRequests, r.TotalEvents, r.TotalBlockOps} }
	if cb, cr := counts(built[0]), counts(replayed[0]); cb != cr || cb[0] == 0 {
		t.Fatalf("built %v, replayed from the file %v", cb, cr)
	}
	if p := replayed[0].Provenance; p.TracePath != a || p.TraceSHA256 == nil || len(*p.TraceSHA256) != 64 {
		t.Fatalf("provenance %+v", p)
	}
	da[9] ^= 0xFF // the version
	bad := filepath.Join(dir, "bad.smg")
	if err := os.WriteFile(bad, da, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runArgs(t, "indexer", "-corpus", bad, "-quiet"); err == nil || !strings.Contains(err.Error(), "offset") {
		t.Fatalf("a damaged corpus: %v, want an error naming the offset", err)
	}
	if _, _, err := runArgs(t, "corpus", "-out", a, "-corpus", a, "-duration", "1s", "-quiet"); err != nil {
		t.Fatalf("a corpus rescaled in place: %v", err)
	}
	if oc, err := openloop.ReadFile(a); err != nil || oc.ReferenceWindow != time.Second {
		t.Fatalf("a corpus rescaled in place: %v, window %v", err, oc.ReferenceWindow)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-out", filepath.Join(dir, "missing", "c.smg")}, "no such file"},
		{[]string{"-out", dir}, "is a directory"},
		{[]string{"-out", filepath.Join(dir, "c.smg"), "-trace", filepath.Join(dir, "none.jsonl")}, "no such file"},
		{[]string{"-out", filepath.Join(dir, "c.smg"), "-compare", "compressed"}, "not defined"}, // the indexer's, which did nothing here
	} {
		stdout, stderr, err := runArgs(t, append([]string{"corpus"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.says) || strings.Contains(stdout+stderr, "building the corpus") {
			t.Errorf("corpus %v: %v after %q, want refused saying %q before any build", tc.args, err, stdout+stderr, tc.says)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "c.smg*")); len(left) > 0 {
		t.Errorf("failed corpus commands left %v", left)
	}
}

// `loadgen holes`: lookups across workers' holes, checked against the
// model, are never wrong for any indexer, and the corpus does cross holes.
func TestHoles(t *testing.T) {
	out, _, err := runArgs(t, "holes", "-json", "-stores", "300", "-lookups", "2000", "-chains", "50", "-workers", "8")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Impl           string
			Lookups        int `json:"lookups"`
			Wrong          int `json:"wrong_lookups"`
			PastHole       int `json:"lookups_past_a_hole"`
			RejectedStores int `json:"rejected_stores"`
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Lookups != 2000 || r.Wrong != 0 || r.PastHole < 100 || r.RejectedStores != 0 {
			t.Fatalf("%+v", r)
		}
	}
}

// -json writes each run as a line of Dynamo's result JSON (schema 4): its
// names, durations in ns, the totals adding up, the provenance, and
// kvradix's own keys; -format v4 is its synonym.
func TestIndexerV4(t *testing.T) {
	out, _, err := runArgs(t, append([]string{"indexer", "-format", "v4", "-duration", "300ms", "-compare", "single,compressed"}, indexerSmall...)...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want one per run:\n%s", len(lines), out)
	}
	for _, line := range lines {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		for _, k := range []string{"schema_version", "backend", "benchmark_duration_ms", "block_size", "query_lanes", "issuer_threads", "event_workers",
			"total_requests", "total_events", "total_stored_events", "total_removed_events", "total_cleared_events", "total_request_blocks",
			"total_stored_blocks", "total_removed_blocks", "total_logical_ops", "total_block_ops", "offered_logical_ops_per_sec",
			"achieved_block_ops_per_sec", "read_issue_lag", "update_issue_lag", "query_service", "update_accepted_to_finished",
			"issuer_cpu_ns", "issue_span_ns", "drain_ns", "generator_valid", "kept_up", "failure_reasons", "provenance",
			"lane_cpu_ns", "achieved_block_ops_per_lane_cpu_sec", "issuer_cpu_fraction", "host_idle_fraction", "host_steal_fraction", "host_other_fraction", "index", "lanes", "elapsed_ns", "pairs", "bytes_per_pair",
			"rejected_events", "events_queued_fraction", "outstanding_updates_at_stop", "queue_depth_at_stop", "generator_gate"} {
			if _, ok := r[k]; !ok {
				t.Errorf("no %q", k)
			}
		}
		if r["schema_version"] != 4.0 || r["total_block_ops"] != r["total_request_blocks"].(float64)+r["total_stored_blocks"].(float64)+r["total_removed_blocks"].(float64) {
			t.Fatalf("%v", line)
		}
		if p50 := r["query_service"].(map[string]any)["p50_ns"].(float64); p50 <= 0 {
			t.Fatalf("query service p50 %v ns", p50)
		}
		if argv := r["provenance"].(map[string]any)["argv"].([]any); len(argv) == 0 {
			t.Fatal("no argv in the provenance")
		}
		idle, steal, other := r["host_idle_fraction"].(float64), r["host_steal_fraction"].(float64), r["host_other_fraction"].(float64)
		if idle < 0 || steal < 0 || other < 0 || idle+steal+other > 1 {
			t.Fatalf("the machine idle %v, stolen %v and other processes' %v of its CPU time over the run", idle, steal, other)
		}
	}
}

// A corpus from another exporter numbers its events its own way (Dynamo's
// event ids): the replay keys them by position and replays it whole (ids
// past the corpus's length indexed out of range).
func TestForeignCorpus(t *testing.T) {
	oc := &openloop.Corpus{Header: openloop.Header{BlockSize: 16, ReferenceWindow: 100 * time.Millisecond, LogicalWorkers: 2, TracePath: "elsewhere"}}
	for i := range 20 {
		w := kvevent.WorkerID(i % 2)
		oc.Ops = append(oc.Ops, openloop.Op{Deadline: time.Duration(i) * time.Millisecond, Worker: w,
			Event: kvevent.Event{ID: 1 << 40, Data: kvevent.Stored{Blocks: []kvevent.StoredBlock{{BlockHash: uint64(100 + i), TokensHash: uint64(i)}}}}},
			openloop.Op{Deadline: time.Duration(i)*time.Millisecond + 1, Worker: w, Query: []uint64{uint64(i)}})
	}
	path := filepath.Join(t.TempDir(), "foreign.smg")
	if err := oc.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	rs := indexerLines(t, "-compare", "compressed", "-corpus", path, "-quiet")
	if len(rs) != 1 || rs[0].TotalEvents != 20 || rs[0].RejectedEvents != 0 || !rs[0].GeneratorValid {
		t.Fatalf("%+v", rs)
	}
}
