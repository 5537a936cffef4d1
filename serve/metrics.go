package serve

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// metrics is the service's Prometheus metrics. Counters kept by the
// indexes and subscribers are read when scraped (Collect), so the hot
// paths pay nothing for them; the query latencies and block counts are
// observed as queries are answered.
type metrics struct {
	registry  *prometheus.Registry
	queryTime *prometheus.HistogramVec // by endpoint
	requested *prometheus.CounterVec   // blocks asked for, by model
	matched   *prometheus.CounterVec   // of those, held by the best instance
	decisions *prometheus.CounterVec   // queries whose best instance this is
	routeTime prometheus.Histogram     // time to decide and admit a /route
	routed    *prometheus.CounterVec   // routes, by model and chosen instance
	saves     *prometheus.CounterVec   // state saves, by result
	saveTime  prometheus.Histogram
	lastSave  prometheus.Gauge // when the last good save ended
	// The model's predictions against the events, on routes to modelled
	// engines whose events flow (approx.go), by model.
	predicted, reported, confirmed *prometheus.CounterVec
	s                              *Service
}

var (
	descApplied   = prometheus.NewDesc("kvradix_events_applied_total", "KV events applied to a model's index.", []string{"model"}, nil)
	descRejected  = prometheus.NewDesc("kvradix_events_rejected_total", "KV events a model's index refused, by reason.", []string{"model", "reason"}, nil)
	descIgnored   = prometheus.NewDesc("kvradix_events_ignored_tier_total", "KV events of another tier than the device, not indexed.", []string{"model"}, nil)
	descPairs     = prometheus.NewDesc("kvradix_index_pairs", "(instance, block) pairs a model's index holds.", []string{"model"}, nil)
	descBytes     = prometheus.NewDesc("kvradix_index_estimated_bytes", "A model's index's memory, estimated at 28 bytes a pair (the measured figure on the trace).", []string{"model"}, nil)
	descDepth     = prometheus.NewDesc("kvradix_index_queue_depth", "KV events queued in a model's index lanes.", []string{"model"}, nil)
	descGaps      = prometheus.NewDesc("kvradix_subscriber_gaps_total", "Sequence gaps found in an engine's stream, by outcome.", []string{"model", "instance", "dp_rank", "outcome"}, nil)
	descReplayed  = prometheus.NewDesc("kvradix_subscriber_replayed_batches_total", "Batches recovered from an engine's replay socket.", []string{"model", "instance", "dp_rank"}, nil)
	descRestarts  = prometheus.NewDesc("kvradix_subscriber_resyncs_total", "Engine restarts resynced (its blocks cleared).", []string{"model", "instance", "dp_rank"}, nil)
	descLost      = prometheus.NewDesc("kvradix_subscriber_lost_batches_total", "Batches lost: not repairable, or undecodable.", []string{"model", "instance", "dp_rank"}, nil)
	descReceived  = prometheus.NewDesc("kvradix_subscriber_last_sequence", "The last sequence number received from an engine.", []string{"model", "instance", "dp_rank"}, nil)
	descBusSeq    = prometheus.NewDesc("kvradix_bus_sequence", "The last sequence of a model's bus stream its index applied (on a bus).", []string{"model"}, nil)
	descBusBad    = prometheus.NewDesc("kvradix_bus_bad_messages_total", "Messages of a model's bus stream that did not decode or apply (on a bus).", []string{"model"}, nil)
	descDown      = prometheus.NewDesc("kvradix_subscriber_down", "1 while an engine's connection is down (its last receive failed; reconnecting), else 0.", []string{"model", "instance", "dp_rank"}, nil)
	descLastMsg   = prometheus.NewDesc("kvradix_subscriber_last_message_timestamp_seconds", "When the last message from an engine came, live or replayed, in Unix seconds.", []string{"model", "instance", "dp_rank"}, nil)
	descRefused   = prometheus.NewDesc("kvradix_subscriber_events_refused_total", "An engine's events not indexed, by reason: another block size, a token count not block_size per hash, another KV cache group, an unknown type, undecodable (in a batch whose other events applied), remote (locality REMOTE), foreign (RFC #1527 events naming another model or tenant than the engine's), multimodal (stores cut at their first block with a multimodal input or prompt embeddings, which kvradix does not hash; the text blocks before it are indexed), ownership (events an offload connector owns, vLLM 2026).", []string{"model", "instance", "dp_rank", "reason"}, nil)
	descUndecod   = prometheus.NewDesc("kvradix_subscriber_undecodable_batches_total", "An engine's batches that did not decode at all (each also a lost batch).", []string{"model", "instance", "dp_rank"}, nil)
	descBadFrame  = prometheus.NewDesc("kvradix_subscriber_bad_frames_total", "An engine's live messages not [topic, 8-byte sequence, payload], or frames over the size limit.", []string{"model", "instance", "dp_rank"}, nil)
	descEngines   = prometheus.NewDesc("kvradix_engines", "Registered engines (instance and rank) by status: active (subscribed to), pending (first dial in progress), failed (dials failed; retried).", []string{"model", "status"}, nil)
	descDisconnct = prometheus.NewDesc("kvradix_subscriber_disconnects_total", "Receive errors on an engine's connection (it reconnects).", []string{"model", "instance", "dp_rank"}, nil)
	descCopies    = prometheus.NewDesc("kvradix_subscriber_copies_kept_total", "An engine's removed block hashes kept in the index because the engine holds another copy (vLLM keeps duplicate blocks).", []string{"model", "instance", "dp_rank"}, nil)
	descPredicted = prometheus.NewDesc("kvradix_engines_predicted", "Engines (instance and rank) routed on the model of their cache, by reason: event_free (registered without an endpoint), stale (no message for -events-stale-after).", []string{"model", "reason"}, nil)
	descModelHeld = prometheus.NewDesc("kvradix_approx_blocks", "Blocks the models of a model's engines' caches hold, and the requests leasing blocks there.", []string{"model", "what"}, nil)
	descModelEvic = prometheus.NewDesc("kvradix_approx_evicted_blocks_total", "Blocks the models of a model's engines' caches evicted for capacity.", []string{"model"}, nil)
	descInFlight  = prometheus.NewDesc("kvradix_requests_in_flight", "Requests routed and not yet completed or expired (what=requests), and the blocks they count against -max-routed-blocks (what=blocks: their prompts' blocks and 4 for each).", []string{"what"}, nil)
	descModeled   = prometheus.NewDesc("kvradix_engines_modeled", "Engines (instance and rank) registered with total_kv_blocks, whose cache the service models from its routes.", []string{"model"}, nil)
)

func newMetrics(s *Service) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		queryTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvradix_query_duration_seconds", Help: "Time to answer a query, by endpoint.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 12),
		}, []string{"endpoint"}),
		requested: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvradix_query_blocks_requested_total", Help: "Blocks queries asked about, by model."}, []string{"model"}),
		matched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvradix_query_blocks_matched_total",
			Help: "Blocks the best-matching instance held, by model: over kvradix_query_blocks_requested_total, the predicted hit rate."}, []string{"model"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvradix_query_best_instance_total", Help: "Queries whose longest match was this instance's, by model."}, []string{"model", "instance"}),
		routeTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvradix_route_duration_seconds", Help: "Time to choose an instance for a /route and admit the request.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 12)}),
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvradix_route_decisions_total", Help: "Requests routed to an instance, by model."}, []string{"model", "instance"}),
		saves:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvradix_state_saves_total", Help: "Saves of the state (-state), by result."}, []string{"result"}),
		saveTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvradix_state_save_duration_seconds", Help: "Time to save the state (each index's engines paused while it is encoded).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2.5, 10)}),
		lastSave: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvradix_state_last_save_timestamp_seconds", Help: "When the last good save of the state ended, in Unix seconds."}),
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvradix_approx_predicted_blocks_total",
			Help: "Blocks the model of an engine's cache predicted on the engine a request was routed to, where the engine's events flow, by model."}, []string{"model"}),
		reported: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvradix_approx_reported_blocks_total",
			Help: "Blocks the engine's events said it held on those routes, by model."}, []string{"model"}),
		confirmed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvradix_approx_confirmed_blocks_total",
			Help: "Blocks both said, by model: over predicted, the model's precision; over reported, its recall."}, []string{"model"}),
		s: s,
	}
	m.saves.WithLabelValues("ok")
	m.saves.WithLabelValues("failed")
	m.registry.MustRegister(m, m.queryTime, m.requested, m.matched, m.decisions, m.routeTime, m.routed, m.saves, m.saveTime, m.lastSave,
		m.predicted, m.reported, m.confirmed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observeQuery records one answered query.
func (m *metrics) observeQuery(endpoint, model, tenant string, start time.Time, blocks int, res radix.OverlapScores) {
	m.queryTime.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
	name := model + ":" + tenantOr(tenant)
	m.requested.WithLabelValues(name).Add(float64(blocks))
	var best uint32
	var bestWorker kvevent.Worker
	for wk, n := range res.Scores {
		if n > best {
			best, bestWorker = n, wk
		}
	}
	m.matched.WithLabelValues(name).Add(float64(best))
	if best > 0 {
		m.decisions.WithLabelValues(name, strconv.FormatUint(uint64(bestWorker.ID), 10)).Inc()
	}
}

// observeRoute records one admitted route.
func (m *metrics) observeRoute(model, tenant string, start time.Time, instance uint64) {
	m.routeTime.Observe(time.Since(start).Seconds())
	m.routed.WithLabelValues(model+":"+tenantOr(tenant), strconv.FormatUint(instance, 10)).Inc()
}

// observePrediction records how a modelled engine's prediction compared
// with its events' overlap on one route.
func (m *metrics) observePrediction(model string, predicted, events uint32) {
	m.predicted.WithLabelValues(model).Add(float64(predicted))
	m.reported.WithLabelValues(model).Add(float64(events))
	m.confirmed.WithLabelValues(model).Add(float64(min(predicted, events)))
}

// observeSave records one save of the state, started at start, that
// ended with *err (deferred).
func (m *metrics) observeSave(start time.Time, err *error) {
	if *err != nil {
		m.saves.WithLabelValues("failed").Inc()
		return
	}
	m.saves.WithLabelValues("ok").Inc()
	m.saveTime.Observe(time.Since(start).Seconds())
	m.lastSave.SetToCurrentTime()
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descApplied, descRejected, descIgnored, descPairs, descBytes, descDepth,
		descGaps, descReplayed, descRestarts, descLost, descReceived, descDisconnct, descDown, descLastMsg, descBusSeq, descBusBad,
		descRefused, descUndecod, descBadFrame, descEngines, descPredicted, descModeled, descCopies, descModelHeld, descModelEvic, descInFlight} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the indexes' and subscribers'
// counters, read now.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descInFlight, float64(len(s.routes)), "requests")
	gauge(descInFlight, float64(s.routed), "blocks")
	for k, idx := range s.indexes {
		st, model := idx.pool.Stats(), k.String()
		counter(descApplied, st.Applied, model)
		counter(descIgnored, st.IgnoredTier, model)
		for reason, n := range map[string]uint64{"parent_not_found": st.ParentNotFound, "block_not_found": st.BlockNotFound,
			"invalid": st.Invalid, "self_parent": st.SelfParent} {
			counter(descRejected, n, model, reason)
		}
		gauge(descPairs, float64(st.Pairs), model)
		gauge(descBytes, 28*float64(st.Pairs), model)
		gauge(descDepth, float64(st.QueueDepth), model)
		if idx.replica != nil {
			gauge(descBusSeq, float64(idx.replica.Seq()), model)
			counter(descBusBad, idx.replica.Bad(), model)
		}
		ps := idx.pred.state.Load()
		gauge(descModeled, float64(len(ps.modeled)), model)
		as := idx.pred.approx.ApproxStats()
		gauge(descModelHeld, float64(as.Blocks), model, "blocks")
		gauge(descModelHeld, float64(as.Leased), model, "leases")
		counter(descModelEvic, as.Evicted, model)
		for _, reason := range []string{predictedEventFree, predictedStale} {
			n := 0
			for _, why := range ps.routed {
				if why == reason {
					n++
				}
			}
			gauge(descPredicted, float64(n), model, reason)
		}
	}
	engines := map[[2]string]int{}
	for k := range s.instances {
		engines[[2]string{k.String(), "active"}]++
	}
	for k, d := range s.pending {
		status := "pending"
		if d.err != nil {
			status = "failed"
		}
		engines[[2]string{k.String(), status}]++
	}
	for k := range s.indexes {
		for _, status := range []string{"active", "pending", "failed"} {
			gauge(descEngines, float64(engines[[2]string{k.String(), status}]), k.String(), status)
		}
	}
	// Engines are labelled by model too: one instance id may serve two
	// models, and "model:tenant" is unique (a tenant holds no ':').
	for k, inst := range s.instances {
		if inst.sub == nil {
			continue // an engine without events
		}
		st, model, id, rank := inst.sub.Stats(), k.String(), fmt.Sprint(uint64(k.instance)), fmt.Sprint(k.rank)
		counter(descGaps, st.GapsRepaired, model, id, rank, "repaired")
		counter(descGaps, st.GapsLost, model, id, rank, "lost")
		counter(descReplayed, st.Replayed, model, id, rank)
		counter(descRestarts, st.Restarts, model, id, rank)
		counter(descLost, st.BatchesLost, model, id, rank)
		counter(descDisconnct, st.Disconnects, model, id, rank)
		counter(descUndecod, st.DecodeErrors, model, id, rank)
		counter(descBadFrame, st.BadFrames+st.FramesRefused, model, id, rank)
		cs := st.Convert
		counter(descCopies, cs.CopiesKept, model, id, rank)
		for reason, n := range map[string]uint64{"block_size": cs.BadBlockSize, "token_count": cs.BadTokenCount, "other_group": cs.OtherGroup,
			"unknown_type": cs.UnknownType, "undecodable": cs.Undecodable, "remote": cs.Remote, "foreign": cs.Foreign, "multimodal": cs.Multimodal, "ownership": cs.Ownership} {
			counter(descRefused, n, model, id, rank, reason)
		}
		if r := inst.sub.Received(); len(r) > 0 {
			gauge(descReceived, float64(r[0]), model, id, rank)
		}
		for _, es := range inst.sub.States() {
			down := 0.0
			if es.Down {
				down = 1
			}
			gauge(descDown, down, model, id, rank)
			if !es.LastMessage.IsZero() {
				gauge(descLastMsg, float64(es.LastMessage.UnixNano())/1e9, model, id, rank)
			}
		}
	}
}
