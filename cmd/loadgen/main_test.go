package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvradix/kvradix/internal/leaks"
)

// go-zeromq v0.17 leaves its own PUB writer goroutine behind (see
// ingest/vllm's tests); ours are all checked.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" { // a process of -repeat: be loadgen
		main()
		return
	}
	goleak.VerifyTestMain(m, leaks.Ignore()...)
}

func runArgs(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(args, &out, &errb, make(chan os.Signal))
	return out.String(), errb.String(), err
}

func TestUsage(t *testing.T) {
	if _, _, err := runArgs(t); err == nil {
		t.Fatal("no command accepted")
	}
	if _, stderr, err := runArgs(t, "frobnicate"); err == nil || !strings.Contains(stderr, "usage") {
		t.Fatalf("unknown command: %v %q", err, stderr)
	}
	if out, _, err := runArgs(t, "help"); err != nil || !strings.Contains(out, "replay") {
		t.Fatalf("help: %v %q", err, out)
	}
}

var synthSmall = []string{"-synth", "-synth-requests", "150", "-synth-rate", "30", "-workers", "4", "-blocks", "2048"}

func TestReplayTable(t *testing.T) {
	out, _, err := runArgs(t, append([]string{"replay", "-routers", "round_robin,kv"}, synthSmall...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"round_robin", "kv", "reuse ratio", "ttft p99 ms", "synthetic"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestReplayJSON(t *testing.T) {
	out, _, err := runArgs(t, append([]string{"replay", "-json", "-routers", "round_robin,random,kv"}, synthSmall...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Trace   string `json:"trace"`
		Workers int    `json:"workers"`
		Results []struct {
			Router     string             `json:"router"`
			Requests   int                `json:"requests"`
			ReuseRatio float64            `json:"reuse_ratio"`
			TTFT       map[string]float64 `json:"ttft_ms"`
			TPOT       map[string]float64 `json:"tpot_ms"`
			ITL        map[string]float64 `json:"itl_ms"`
			E2E        map[string]float64 `json:"e2e_ms"`
			RPS        float64            `json:"throughput_rps"`
			TPS        float64            `json:"throughput_tps"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if rep.Workers != 4 || len(rep.Results) != 3 || rep.Results[2].Router != "kv" || rep.Results[0].Requests != 150 {
		t.Fatalf("%+v", rep)
	}
	for _, r := range rep.Results {
		for _, d := range []map[string]float64{r.TTFT, r.TPOT, r.ITL, r.E2E} {
			for _, k := range []string{"mean", "p50", "p90", "p99"} {
				if _, ok := d[k]; !ok {
					t.Fatalf("%s lacks %s", r.Router, k)
				}
			}
		}
		if r.RPS <= 0 || r.TPS <= 0 {
			t.Fatalf("%s: throughput %v %v", r.Router, r.RPS, r.TPS)
		}
	}
}

func TestReplayBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}`+"\n"), 0o644)
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"replay", "-workers", "0"}, "workers"},
		{[]string{"replay", "-routers", "kv,best"}, "-routers"},
		{[]string{"replay", "-workers", "many"}, "invalid value"},
		{[]string{"replay", "-trace", filepath.Join(dir, "missing.jsonl")}, "no such file"},
		{[]string{"replay", "-trace", bad}, "line 1: hash_ids"},
		{[]string{"replay", "-trace", bad, "-synth"}, "exclusive"},
		{[]string{"replay", "extra"}, "unexpected argument"},
	}
	for _, tc := range tests {
		_, stderr, err := runArgs(t, tc.args...)
		if err == nil || !strings.Contains(err.Error()+stderr, tc.msg) {
			t.Errorf("%v: %v (stderr %q), want %q", tc.args, err, stderr, tc.msg)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error is not one line: %q", tc.args, err)
		}
	}
}

// Every command refuses an argument its flags leave over, naming it,
// before it does any work.
func TestCommandsRefuseExtraArguments(t *testing.T) {
	for _, cmd := range []string{"replay", "indexer", "corpus", "memory", "holes", "router", "ingest", "cluster", "serve"} {
		_, _, err := runArgs(t, cmd, "extra")
		if err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
			t.Errorf("%s extra: %v, want unexpected argument", cmd, err)
		}
	}
}

// On SIGINT every command stops at once (not after its next deadline),
// prints what it has marked interrupted, and fails. Each run below would
// take far longer than the bound.
func TestInterruptStopsEveryCommand(t *testing.T) {
	for _, args := range [][]string{
		append([]string{"indexer", "-duration", "2m", "-compare", "single"}, indexerSmall...),
		{"router", "-synth", "-synth-requests", "100", "-rate", "50", "-duration", "2m", "-workers", "4", "-clients", "2", "-modes", "kv"},
		{"replay", "-routers", "kv,kv_temp,random,round_robin"},
		{"ingest", "-events", "400000", "-engines", "2"},
		{"serve", "-synth", "-synth-requests", "300", "-duration", "2m", "-engines", "2", "-clients", "2", "-rate", "100"},
	} {
		t.Run(args[0], func(t *testing.T) {
			var out, errb bytes.Buffer
			stop := make(chan os.Signal, 1)
			done := make(chan error, 1)
			go func() { done <- run(args, &out, &errb, stop) }()
			time.Sleep(300 * time.Millisecond)
			sent := time.Now()
			stop <- os.Interrupt
			select {
			case err := <-done:
				if took := time.Since(sent); took > 5*time.Second {
					t.Errorf("stopped %v after the interrupt", took)
				}
				if err == nil || !strings.Contains(err.Error(), "interrupted") {
					t.Fatalf("error %v", err)
				}
				if !strings.Contains(out.String(), "interrupted") {
					t.Fatalf("no partial output marked interrupted:\n%s", out.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("still running 30 s after the interrupt")
			}
		})
	}
}
