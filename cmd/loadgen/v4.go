package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"time"

	"github.com/kvradix/kvradix/openloop"
)

// v4 is the run in Dynamo's result JSON (openloop.Result, schema 4); the
// provenance is the report's to fill.
func (s *runState) v4(r indexerResult, stopped, end int64, depth int, update, updateFinished, updateLag []time.Duration) *openloop.Result {
	c := s.c
	v := &openloop.Result{
		SchemaVersion: openloop.SchemaVersion, Backend: "kvradix-" + r.Impl, Timer: "monotonic",
		BenchmarkDurationMs: uint64(c.window.Milliseconds()), BlockSize: uint32(c.cfg.BlockSize),
		QueryLanes: len(s.lanes), IssuerThreads: len(s.lag), EventWorkers: max(r.Lanes, 1),
		IssuerCPUs: []int{}, BackendCPUs: []int{}, GeneratorGate: "deadline-groups",
		ReadIssueLag: openloop.Dist(s.readLag...), UpdateIssueLag: openloop.Dist(updateLag),
		QueryQueueWait: openloop.Dist(s.wait...), QueryService: openloop.Dist(s.service...),
		QueryScheduledToFinished: openloop.Dist(s.finished...), UpdateAcceptedToFinished: openloop.Dist(update),
		UpdateScheduledToFinished: openloop.Dist(updateFinished),
		QueueDepthAtStop:          []int{depth}, IssuerCPUNs: s.harnessCPU.Load(), IssueSpanNs: s.lastIssue.Load(),
		DrainNs: end - stopped, GeneratorValid: r.GeneratorValid, KeptUp: r.KeptUp, FailureReasons: []string{},
		LaneCPUNs: r.LaneCPUNs, AchievedBlockOpsPerLaneCPU: r.BlockOpsPerLaneCPU, IssuerCPUFraction: r.HarnessCPUFrac,
	}
	var t openloop.Totals
	for i := range c.ops {
		o := &c.ops[i]
		t.Add(&openloop.Op{Query: o.query, Event: o.ev})
	}
	v.SetTotals(t, c.window)
	if sec := time.Duration(end).Seconds(); sec > 0 && !r.Interrupted {
		v.AchievedLogicalOpsPerSec, v.AchievedBlockOpsPerSec = float64(v.TotalLogicalOps)/sec, float64(v.TotalBlockOps)/sec
	}
	if sec := time.Duration(v.IssueSpanNs).Seconds(); sec > 0 {
		v.ActualIssueLogicalOpsPerSec = float64(s.issued.Load()) / sec
		v.ActualIssueBlockOpsPerSec = float64(v.TotalBlockOps) / sec
	}
	if !r.GeneratorValid {
		v.FailureReasons = append(v.FailureReasons, "generator_invalid")
	}
	if !r.KeptUp {
		v.FailureReasons = append(v.FailureReasons, "not_kept_up")
	}
	return v
}

// provenance is what produced this process's results: its arguments and
// binary, and the corpus (a -corpus file's digest).
func (c *indexerConfig) provenance() *openloop.Provenance {
	p := &openloop.Provenance{Argv: os.Args, TracePath: c.corpus.Trace, TraceBlockSize: uint32(c.corpus.TraceBlockSize),
		NumGPUBlocks: c.corpus.Blocks, NumUniqueInferenceWorkers: c.corpus.Workers, InferenceWorkerDuplicationFactor: 1,
		TraceLengthFactor: c.corpus.LengthFactor, TraceDuplicationFactor: c.corpus.Dup, Seed: c.corpus.Seed}
	if exe, err := os.Executable(); err == nil {
		p.Binary, p.BinarySHA256 = exe, fileDigest(exe)
	}
	if c.corpusFile != "" {
		if d := fileDigest(c.corpusFile); d != "" {
			p.TraceSHA256 = &d
		}
	}
	return p
}

func fileDigest(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeV4 writes each result as one line of Dynamo's result JSON.
func writeV4(w io.Writer, rep indexerReport, prov *openloop.Provenance) error {
	enc := json.NewEncoder(w)
	for _, r := range rep.Results {
		if r.v4 == nil {
			continue
		}
		v := *r.v4
		v.Provenance = prov
		if err := enc.Encode(&v); err != nil {
			return err
		}
	}
	return nil
}
