package openloop

import (
	"runtime"
	"time"

	"github.com/kvradix/kvradix/internal/rss"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// Memory over time, by Dynamo's indexer_memory method: the corpus's
// operations are replayed in order, as fast as the indexer takes them
// (events through ApplyEvent, lookups through FindMatches), and at evenly
// spaced points the lanes are flushed and the index's live bytes are
// divided by the memberships a set model holds then: distinct (worker,
// rank, block hash). Dynamo counts live bytes with a counting allocator;
// Go has none, so a sample is the live heap after two collections (the
// second empties sync.Pool's victim cache) less the live heap before the
// indexer was built. The model runs first, alone, and is gone before the
// baseline, so its maps are not counted; the corpus is held throughout and
// is in the baseline.

// MemoryConfig is how MeasureMemory samples.
type MemoryConfig struct {
	Samples     int  `json:"samples"`      // evenly spaced points (Dynamo: 100)
	SkipQueries bool `json:"skip_queries"` // replay the events only
}

// MemorySample is the index at one point of the replay.
type MemorySample struct {
	At                  int     `json:"at"` // operations replayed
	Events              int     `json:"events"`
	Queries             int     `json:"queries"`
	Memberships         int     `json:"memberships"`
	UniqueBlocks        int     `json:"unique_blocks"`
	BackendBytes        int64   `json:"backend_bytes"`
	BytesPerMembership  float64 `json:"bytes_per_membership"`
	BytesPerUniqueBlock float64 `json:"bytes_per_unique_block"`
	RSSBytes            int64   `json:"rss_bytes"`
	IndexPairs          int     `json:"index_pairs"` // kvradix: the pairs the index says it holds
}

// MemoryReport is Dynamo's indexer_memory report, the fields that apply
// (kvradix has no periodic sweep: an eviction leaves at once).
type MemoryReport struct {
	Backend                          string         `json:"backend"`
	Allocator                        string         `json:"allocator"`
	Trace                            string         `json:"trace"`
	NumUniqueInferenceWorkers        int            `json:"num_unique_inference_workers"`
	InferenceWorkerDuplicationFactor int            `json:"inference_worker_duplication_factor"`
	TraceDuplicationFactor           int            `json:"trace_duplication_factor"`
	TraceLengthFactor                int            `json:"trace_length_factor"`
	BlockSize                        int            `json:"block_size"`
	NumGPUBlocks                     int            `json:"num_gpu_blocks"`
	EventWorkers                     int            `json:"event_workers"`
	Queries                          bool           `json:"queries"`
	Entries                          int            `json:"entries"` // operations replayed
	TimeAvgBytesPerMembership        float64        `json:"time_avg_bytes_per_membership"`
	MeanBytesOverMeanMemberships     float64        `json:"mean_bytes_over_mean_memberships"`
	TimeAvgBytesPerUniqueBlock       float64        `json:"time_avg_bytes_per_unique_block"`
	MaxBytesPerMembership            float64        `json:"max_bytes_per_membership"`
	FinalBytesPerMembership          float64        `json:"final_bytes_per_membership"`
	PeakBackendBytes                 int64          `json:"peak_backend_bytes"`
	MeanMemberships                  float64        `json:"mean_memberships"`
	ReplaySecs                       float64        `json:"replay_secs"` // the replay alone, not the sampling
	Samples                          []MemorySample `json:"samples"`
	Index                            string         `json:"index"` // kvradix: single, pool or compressed
	Lanes                            int            `json:"lanes"`
}

// MeasureMemory replays c into a fresh indexer of im and samples it.
func MeasureMemory(c *Corpus, im shardpool.Impl, cfg MemoryConfig) MemoryReport {
	cfg.Samples = max(cfg.Samples, 1)
	points := samplePoints(len(c.Ops), cfg.Samples)
	samples := membershipsAt(c, points)
	rep := MemoryReport{Backend: "kvradix-" + im.Name, Allocator: "go-live-heap", Trace: c.TracePath,
		NumUniqueInferenceWorkers: int(c.LogicalWorkers / max(c.TraceDuplication, 1)), InferenceWorkerDuplicationFactor: int(c.WorkerDuplication),
		TraceDuplicationFactor: int(c.TraceDuplication), TraceLengthFactor: int(c.TraceLength), BlockSize: int(c.BlockSize),
		EventWorkers: max(im.Lanes, 1), Queries: !cfg.SkipQueries, Entries: len(c.Ops), Index: im.Name, Lanes: im.Lanes}
	base := liveHeap()
	idx := im.New(int(c.BlockSize))
	defer idx.Close()
	var replay time.Duration
	next := 0
	for k, at := range points {
		t0 := time.Now()
		for ; next < at; next++ {
			op := &c.Ops[next]
			if !op.IsQuery() {
				_ = idx.ApplyEvent(kvevent.RouterEvent{WorkerID: op.Worker, Event: op.Event})
			} else if !cfg.SkipQueries {
				_, _ = idx.FindMatches(op.Query)
			}
		}
		_, _ = idx.Flush()
		replay += time.Since(t0)
		s := &samples[k]
		s.BackendBytes = liveHeap() - base
		s.RSSBytes, s.IndexPairs = rss.Current(), idx.Stats().Pairs
		if s.Memberships > 0 {
			s.BytesPerMembership = float64(s.BackendBytes) / float64(s.Memberships)
		}
		if s.UniqueBlocks > 0 {
			s.BytesPerUniqueBlock = float64(s.BackendBytes) / float64(s.UniqueBlocks)
		}
	}
	rep.ReplaySecs, rep.Samples = replay.Seconds(), samples
	rep.summarise()
	return rep
}

// summarise sets the report's figures from its samples: means over the
// samples that hold a membership.
func (r *MemoryReport) summarise() {
	var n int
	var perMember, perBlock, bytes, members float64
	for _, s := range r.Samples {
		r.PeakBackendBytes = max(r.PeakBackendBytes, s.BackendBytes)
		if s.Memberships == 0 {
			continue
		}
		n++
		perMember += s.BytesPerMembership
		perBlock += s.BytesPerUniqueBlock
		bytes += float64(s.BackendBytes)
		members += float64(s.Memberships)
		r.MaxBytesPerMembership = max(r.MaxBytesPerMembership, s.BytesPerMembership)
	}
	if n == 0 {
		return
	}
	r.TimeAvgBytesPerMembership, r.TimeAvgBytesPerUniqueBlock = perMember/float64(n), perBlock/float64(n)
	r.MeanBytesOverMeanMemberships, r.MeanMemberships = bytes/members, members/float64(n)
	r.FinalBytesPerMembership = r.Samples[len(r.Samples)-1].BytesPerMembership
}

// samplePoints returns k evenly spaced operation counts in (0, n], the
// last n.
func samplePoints(n, k int) []int {
	k = min(k, max(n, 1))
	out := make([]int, k)
	for i := range out {
		out[i] = int(int64(n) * int64(i+1) / int64(k))
	}
	return out
}

// membershipsAt runs the set model over c and returns, for each point,
// the memberships and unique blocks it holds after that many operations.
func membershipsAt(c *Corpus, points []int) []MemorySample {
	var m setModel
	out := make([]MemorySample, len(points))
	var events, queries int
	next := 0
	for k, at := range points {
		for ; next < at; next++ {
			op := &c.Ops[next]
			if op.IsQuery() {
				queries++
				continue
			}
			events++
			m.apply(kvevent.Worker{ID: op.Worker, DPRank: op.Event.DPRank}, op.Event.Data)
		}
		out[k] = MemorySample{At: at, Events: events, Queries: queries, Memberships: m.members, UniqueBlocks: len(m.holders)}
	}
	return out
}

// setModel is what each worker holds as a set of block hashes, and how
// many workers hold each hash.
type setModel struct {
	held    map[kvevent.Worker]map[uint64]struct{}
	holders map[uint64]int
	members int // (worker, hash) pairs held
}

func (m *setModel) apply(w kvevent.Worker, data kvevent.Data) {
	if m.held == nil {
		m.held, m.holders = map[kvevent.Worker]map[uint64]struct{}{}, map[uint64]int{}
	}
	switch d := data.(type) {
	case kvevent.Stored:
		if m.held[w] == nil {
			m.held[w] = map[uint64]struct{}{}
		}
		for _, b := range d.Blocks {
			if _, ok := m.held[w][b.BlockHash]; !ok {
				m.held[w][b.BlockHash] = struct{}{}
				m.holders[b.BlockHash]++
				m.members++
			}
		}
	case kvevent.Removed:
		for _, h := range d.BlockHashes {
			m.drop(w, h)
		}
	case kvevent.Cleared:
		for h := range m.held[w] {
			m.drop(w, h)
		}
	}
}

func (m *setModel) drop(w kvevent.Worker, h uint64) {
	if _, ok := m.held[w][h]; !ok {
		return
	}
	delete(m.held[w], h)
	m.members--
	if m.holders[h]--; m.holders[h] == 0 {
		delete(m.holders, h)
	}
}

// liveHeap is the live heap in bytes after two collections.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
