package openloop

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"slices"
	"time"
)

// SchemaVersion is the version of Dynamo's OpenLoopResult that Result
// follows.
const SchemaVersion = 4

// Result is one run of the open-loop protocol in Dynamo's result JSON
// (mooncake_bench's OpenLoopResult, schema version 4): the fields that
// apply to kvradix, with Dynamo's names and meanings (durations in ns,
// rates per second, achieved rates drain included), and kvradix's own keys
// after them. Post-processing written for Dynamo's and SMG's results reads
// it as theirs.
type Result struct {
	SchemaVersion       int    `json:"schema_version"`
	Backend             string `json:"backend"`
	Timer               string `json:"timer"`
	BenchmarkDurationMs uint64 `json:"benchmark_duration_ms"`
	BlockSize           uint32 `json:"block_size"`
	PreRunQuiescenceMs  uint64 `json:"pre_run_quiescence_ms"`
	QueryLanes          int    `json:"query_lanes"`
	IssuerThreads       int    `json:"issuer_threads"`
	EventWorkers        int    `json:"event_workers"`
	IssuerCPUs          []int  `json:"issuer_cpus"`
	QueryIssuerCPU      *int   `json:"query_issuer_cpu"`
	BackendCPUs         []int  `json:"backend_cpus"`

	TotalRequests      uint64 `json:"total_requests"`
	TotalEvents        uint64 `json:"total_events"`
	TotalStoredEvents  uint64 `json:"total_stored_events"`
	TotalRemovedEvents uint64 `json:"total_removed_events"`
	TotalClearedEvents uint64 `json:"total_cleared_events"`
	TotalRequestBlocks uint64 `json:"total_request_blocks"`
	TotalStoredBlocks  uint64 `json:"total_stored_blocks"`
	TotalRemovedBlocks uint64 `json:"total_removed_blocks"`
	TotalLogicalOps    uint64 `json:"total_logical_ops"`
	TotalBlockOps      uint64 `json:"total_block_ops"`

	OfferedLogicalOpsPerSec     float64 `json:"offered_logical_ops_per_sec"`
	ActualIssueLogicalOpsPerSec float64 `json:"actual_issue_logical_ops_per_sec"`
	AchievedLogicalOpsPerSec    float64 `json:"achieved_logical_ops_per_sec"`
	OfferedBlockOpsPerSec       float64 `json:"offered_block_ops_per_sec"`
	ActualIssueBlockOpsPerSec   float64 `json:"actual_issue_block_ops_per_sec"`
	AchievedBlockOpsPerSec      float64 `json:"achieved_block_ops_per_sec"`

	ReadIssueLag              Distribution `json:"read_issue_lag"`
	UpdateIssueLag            Distribution `json:"update_issue_lag"`
	GeneratorGate             string       `json:"generator_gate"`
	QueryQueueWait            Distribution `json:"query_queue_wait"`
	QueryService              Distribution `json:"query_service"`
	QueryScheduledToFinished  Distribution `json:"query_scheduled_to_finished"`
	UpdateAcceptedToFinished  Distribution `json:"update_accepted_to_finished"`
	UpdateScheduledToFinished Distribution `json:"update_scheduled_to_finished"`
	QueueDepthAtStop          []int        `json:"queue_depth_at_stop"`
	OutstandingUpdatesAtStop  int          `json:"outstanding_updates_at_stop"`
	IssuerCPUNs               int64        `json:"issuer_cpu_ns"`
	IssueSpanNs               int64        `json:"issue_span_ns"`
	DrainNs                   int64        `json:"drain_ns"`
	GeneratorValid            bool         `json:"generator_valid"`
	KeptUp                    bool         `json:"kept_up"`
	FailureReasons            []string     `json:"failure_reasons"`
	Provenance                *Provenance  `json:"provenance"`

	// kvradix's keys. LaneCPUNs is the CPU the index used during the run:
	// the process's, less the issuers' and feeders' (their threads' CPU
	// clocks over each stretch of their work, and one reading of that
	// clock a stretch, HarnessClockReadNs, which the stretch's two readings
	// cost but do not see: see runState.work), so the lanes, the lookups
	// and the collector working for
	// them; AchievedBlockOpsPerLaneCPU, the block operations over it, is
	// what the field calls block-ops/s per lane core. IssuerCPUFraction is
	// the harness's CPU over the elapsed time × GOMAXPROCS: the share of
	// the machine it took from the index. ProcessSysCPUNs and PageFaults
	// are the process's system CPU and page faults over the run: on a
	// virtual machine most system CPU is faulting in the memory the index
	// grows into. HostIdleFraction, HostStealFraction and
	// HostOtherFraction are the shares of the machine's CPU time (all its
	// cores) over the run that were idle, that the hypervisor took from the
	// virtual machine, and that other processes used: stolen time slows the
	// run's wall clock (achieved, kept_up) but is not in its CPU
	// (LaneCPUNs); other processes' time takes cores the run would use.
	// IndexBuildNs is the time to make the empty index (a table sized up
	// front is allocated and made resident then).
	LaneCPUNs                  int64   `json:"lane_cpu_ns"`
	AchievedBlockOpsPerLaneCPU float64 `json:"achieved_block_ops_per_lane_cpu_sec"`
	IssuerCPUFraction          float64 `json:"issuer_cpu_fraction"`
	ProcessSysCPUNs            int64   `json:"process_sys_cpu_ns"`
	PageFaults                 int64   `json:"page_faults"`
	HostIdleFraction           float64 `json:"host_idle_fraction"`
	HostStealFraction          float64 `json:"host_steal_fraction"`
	HostOtherFraction          float64 `json:"host_other_fraction"`
	IndexBuildNs               int64   `json:"index_build_ns"`
	HarnessClockReadNs         int64   `json:"harness_clock_read_ns"`
	Index                      string  `json:"index"` // single, pool or compressed
	Lanes                      int     `json:"lanes"`
	ElapsedNs                  int64   `json:"elapsed_ns"` // first deadline to the last completion, drain included
	Pairs                      int     `json:"pairs"`      // (worker, block) pairs held at the end
	BytesPerPair               float64 `json:"bytes_per_pair"`
	RejectedEvents             uint64  `json:"rejected_events"`
	EventsQueuedFraction       float64 `json:"events_queued_fraction"` // of all events, those queued when the issuers stopped
	Interrupted                bool    `json:"interrupted,omitempty"`
	// Sweep, on the result a sweep chose, is every window it tried.
	Sweep []SweepPoint `json:"sweep,omitempty"`
}

// SetTotals fills the totals and the offered rates over window.
func (r *Result) SetTotals(t Totals, window time.Duration) {
	r.TotalRequests, r.TotalStoredEvents, r.TotalRemovedEvents, r.TotalClearedEvents = t.Requests, t.StoredEvents, t.RemovedEvents, t.ClearedEvents
	r.TotalRequestBlocks, r.TotalStoredBlocks, r.TotalRemovedBlocks = t.RequestBlocks, t.StoredBlocks, t.RemovedBlocks
	r.TotalEvents = t.StoredEvents + t.RemovedEvents + t.ClearedEvents
	r.TotalLogicalOps, r.TotalBlockOps = t.LogicalOps(), t.BlockOps()
	if s := window.Seconds(); s > 0 {
		r.OfferedLogicalOpsPerSec, r.OfferedBlockOpsPerSec = float64(r.TotalLogicalOps)/s, float64(r.TotalBlockOps)/s
	}
}

// Distribution is a latency distribution in ns, nearest-rank percentiles.
type Distribution struct {
	P50  uint64 `json:"p50_ns"`
	P99  uint64 `json:"p99_ns"`
	P999 uint64 `json:"p999_ns"`
	Max  uint64 `json:"max_ns"`
}

// Dist summarises samples (it sorts a copy).
func Dist(samples ...[]time.Duration) Distribution {
	var all []time.Duration
	for _, s := range samples {
		all = append(all, s...)
	}
	if len(all) == 0 {
		return Distribution{}
	}
	slices.Sort(all)
	rank := func(q float64) uint64 {
		i := int(q*float64(len(all))+0.999999) - 1 // nearest rank: ceil(q·n)
		return uint64(max(all[min(max(i, 0), len(all)-1)], 0))
	}
	return Distribution{P50: rank(0.5), P99: rank(0.99), P999: rank(0.999), Max: uint64(max(all[len(all)-1], 0))}
}

// Provenance is what produced a result.
type Provenance struct {
	Argv                             []string `json:"argv"`
	Binary                           string   `json:"binary"`
	BinarySHA256                     string   `json:"binary_sha256"`
	TracePath                        string   `json:"trace_path"`
	TraceSHA256                      *string  `json:"trace_sha256"`
	TraceBlockSize                   uint32   `json:"trace_block_size"`
	NumGPUBlocks                     int      `json:"num_gpu_blocks"`
	NumUniqueInferenceWorkers        int      `json:"num_unique_inference_workers"`
	InferenceWorkerDuplicationFactor int      `json:"inference_worker_duplication_factor"`
	TraceLengthFactor                int      `json:"trace_length_factor"`
	TraceDuplicationFactor           int      `json:"trace_duplication_factor"`
	TraceSimulationDurationMs        *uint64  `json:"trace_simulation_duration_ms"`
	Seed                             uint64   `json:"seed"`
	JumpSize                         *int     `json:"jump_size"`
	IssuerSpinUs                     int      `json:"issuer_spin_us"`
	IssueLagDiagnosticThresholdUs    int      `json:"issue_lag_diagnostic_threshold_us"`
}

// NewProvenance is what produced this process's results: its arguments
// and binary (with its SHA-256), the corpus's parameters, and a corpus
// file's path and digest when one was replayed (corpusFile; "" for a
// corpus built in the process).
func NewProvenance(cfg BuildConfig, corpusFile string) *Provenance {
	p := &Provenance{Argv: os.Args, TracePath: cfg.Trace, TraceBlockSize: uint32(cfg.TraceBlockSize),
		NumGPUBlocks: cfg.Blocks, NumUniqueInferenceWorkers: cfg.Workers, InferenceWorkerDuplicationFactor: 1,
		TraceLengthFactor: cfg.LengthFactor, TraceDuplicationFactor: cfg.Dup, Seed: cfg.Seed}
	if exe, err := os.Executable(); err == nil {
		p.Binary, p.BinarySHA256 = exe, fileDigest(exe)
	}
	if corpusFile != "" {
		p.TracePath = corpusFile
		if d := fileDigest(corpusFile); d != "" {
			p.TraceSHA256 = &d
		}
	}
	return p
}

// fileDigest is the hex SHA-256 of the file at path ("" if unread).
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
