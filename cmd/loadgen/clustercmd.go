package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/cluster"
	"github.com/kvradix/kvradix/internal/stats"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix/holdings"
	"github.com/kvradix/kvradix/replay"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/shardpool"
	"github.com/kvradix/kvradix/trace"
)

type clusterResult struct {
	Mode         string  `json:"mode"`
	Replicas     int     `json:"replicas"`
	ReuseRatio   float64 `json:"reuse_ratio"`
	TTFTMs       msStats `json:"ttft_ms"`
	EventLagMs   msStats `json:"event_lag_ms"`
	IndexesEqual bool    `json:"indexes_equal"`
	LoadCV       float64 `json:"load_cv"` // requests per engine
	Requests     int     `json:"requests"`
	ElapsedS     float64 `json:"elapsed_s"`
	// -faults: replicas killed and restarted from a snapshot, and NATS
	// server restarts, during the run.
	ReplicaRestarts int `json:"replica_restarts"`
	ServerRestarts  int `json:"server_restarts"`
	// -faults: a hostile client's tries (a connection without the
	// server's token: refused; forged load messages: dropped by every
	// sharing replica), and snapshots refused as corrupt before the
	// replacement replica restored a good one.
	HostileRefused   bool   `json:"hostile_refused"`
	ForgeriesDropped uint64 `json:"forgeries_dropped"`
	SnapshotsRefused int    `json:"snapshots_refused"`
	// -faults: replicas that found the stream lost below them and were
	// replaced by ones starting clean on the re-created stream.
	StreamResets int `json:"stream_resets"`
}

// msStats carries whichever of mean, p50 and p99 a figure reports.
type msStats struct {
	Mean float64 `json:"mean,omitempty"`
	P50  float64 `json:"p50,omitempty"`
	P99  float64 `json:"p99"`
}

type clusterReport struct {
	Command      string          `json:"command"`
	Trace        string          `json:"trace"`
	Faults       bool            `json:"faults"`
	Results      []clusterResult `json:"results"`
	CatchUpMs    float64         `json:"catch_up_ms"`
	CatchUpPairs int             `json:"catch_up_pairs"` // the restored index's (worker, block) pairs
}

// clusterConfig is what `loadgen cluster` was asked to do.
type clusterConfig struct {
	work          workloadFlags
	sim           replay.Config
	out           output
	replicas      int
	natsURL       string
	faults        bool
	restartServer func() error // nil for an external server
}

func (c *clusterConfig) register(fs *flag.FlagSet) {
	c.work.register(fs)
	c.out.register(fs)
	c.sim = replay.DefaultConfig()
	fs.IntVar(&c.sim.Workers, "workers", c.sim.Workers, "mock engines")
	fs.IntVar(&c.sim.Blocks, "blocks", c.sim.Blocks, "KV blocks per engine")
	fs.IntVar(&c.sim.BlockSize, "block-size", c.sim.BlockSize, "tokens per KV block")
	fs.Float64Var(&c.sim.Speedup, "speedup", c.sim.Speedup, "divide arrival times by this")
	fs.IntVar(&c.replicas, "replicas", 3, "router replicas; requests are spread over them round robin")
	fs.StringVar(&c.natsURL, "nats", "", "NATS server or cluster `url` (JetStream enabled); default: an embedded server")
	fs.BoolVar(&c.faults, "faults", false, "a quarter of the way, a hostile client (no token: refused; forged load: dropped); a third, kill a replica, corrupt its snapshot, and restart it from a good one; half way, restart the embedded NATS server (JetStream on disk)")
}

// runCluster replays the trace through mock engines routed by one router,
// by N replicas sharing load, and by N replicas that do not, all fed by one
// JetStream event stream each; every replica's index is checked against a
// reference built from every event.
func runCluster(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("cluster", stderr)
	var c clusterConfig
	c.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if c.replicas < 1 || c.replicas > 64 {
		return fmt.Errorf("-replicas %d, want in [1, 64]", c.replicas)
	}
	if err := errors.Join(c.sim.Validate(), c.out.validate()); err != nil {
		return err
	}
	intr, release := watch(stop)
	defer release()
	reqs, name, err := c.work.load()
	if err != nil {
		return err
	}
	url := c.natsURL
	var restart func() error // restarts the embedded server
	if url == "" {
		dir, err := os.MkdirTemp("", "kvradix-nats-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := cluster.StartEmbedded(dir)
		if err != nil {
			return err
		}
		defer func() { srv.Shutdown() }()
		url = srv.URL()
		restart = func() error {
			port := srv.Port()
			srv.Shutdown()
			srv, err = cluster.StartEmbeddedOn(dir, port)
			return err
		}
	}
	c.restartServer = restart
	ctx, cancel := intr.context()
	defer cancel()
	rep := clusterReport{Command: commandLine("cluster", args), Trace: name, Faults: c.faults}
	for _, m := range []struct {
		name     string
		replicas int
		share    bool
	}{{"single", 1, false}, {"shared", c.replicas, true}, {"unshared", c.replicas, false}} {
		res, catchUp, pairs, err := c.run(ctx, url, reqs, m.name, m.replicas, m.share, stderr)
		if err != nil {
			if intr.Load() {
				break
			}
			return fmt.Errorf("%s: %w", m.name, err)
		}
		rep.Results = append(rep.Results, res)
		if m.share {
			rep.CatchUpMs, rep.CatchUpPairs = catchUp, pairs
		}
	}
	if err := c.out.write(stdout, rep, func() { printCluster(stdout, rep) }, func() { printClusterBench(stdout, rep) }); err != nil {
		return err
	}
	if intr.Load() {
		return errInterrupted
	}
	return nil
}

// clusterPolicy routes the simulation's requests over replicas, round
// robin, and publishes its engines' events to the stream.
type clusterPolicy struct {
	ctx      context.Context
	bus      *cluster.Bus
	replicas []*clusterReplica
	owner    map[uuid.UUID]*clusterReplica
	ref      holdings.Set // every event published
	dp       int
	failed   error
	// -faults: the request before which a replica is killed and restarted
	// from a snapshot, and the one before which the server restarts (0:
	// none).
	killAt, restartAt, hostileAt, loseAt int
	restart                              func() error
	url, stream, bucket, loadSubject     string
	hostileRefused                       bool
	snapshotsRefused, streamResets       int
	newReplica                           func(from uint64) (*clusterReplica, error)
	dead                                 []*clusterReplica // killed: their requests' reports go nowhere
	replicaRestarts                      int
	serverRestarts                       int
}

type clusterReplica struct {
	pool    *shardpool.Pool
	router  *router.Router
	follow  *cluster.Replica
	share   *cluster.Share
	decided context.Context // cancelled: a decision never waits
	killed  bool
}

func (c *clusterConfig) run(ctx context.Context, url string, reqs []trace.Request, mode string, n int, share bool, progress io.Writer) (clusterResult, float64, int, error) {
	suffix := fmt.Sprintf("%s_%d", mode, time.Now().UnixNano())
	bus, err := cluster.Connect(ctx, url, cluster.Config{Stream: "KV_" + suffix, Subject: "kv." + suffix, Bucket: "SNAP_" + suffix})
	if err != nil {
		return clusterResult{}, 0, 0, err
	}
	defer bus.Close()
	p := &clusterPolicy{ctx: ctx, bus: bus, owner: map[uuid.UUID]*clusterReplica{}, ref: holdings.Set{}, dp: c.sim.DPSize,
		url: url, stream: "KV_" + suffix, bucket: "SNAP_" + suffix, loadSubject: "kv.load." + suffix}
	done, cancelled := context.WithCancel(context.Background())
	cancelled() // a decision that would queue returns at once
	p.newReplica = func(from uint64) (*clusterReplica, error) {
		r, err := c.replica(ctx, url, bus, "kv.load."+suffix, share, from)
		if err == nil {
			r.decided = done
		}
		return r, err
	}
	for range n {
		r, err := p.newReplica(0)
		if err != nil {
			return clusterResult{}, 0, 0, err
		}
		p.replicas = append(p.replicas, r)
	}
	if c.faults {
		if n > 1 {
			p.killAt = len(reqs) / 3
		}
		if c.restartServer != nil {
			p.restartAt, p.restart = len(reqs)/2, c.restartServer
			p.hostileAt = len(reqs) / 4 // the embedded server's token is known
			p.loseAt = 2 * len(reqs) / 3
		}
	}
	defer func() {
		for _, r := range p.replicas {
			r.close()
		}
	}()
	start := time.Now()
	res, err := replay.RunPolicy(ctx, reqs, mode, c.sim, p)
	if err == nil {
		err = p.failed
	}
	if err != nil {
		return clusterResult{}, 0, 0, err
	}
	out := clusterResult{Mode: mode, Replicas: n, ReuseRatio: res.ReuseRatio, TTFTMs: msStats{Mean: res.TTFT.Mean, P99: res.TTFT.P99},
		LoadCV: res.Load.CV, Requests: res.Requests, ElapsedS: time.Since(start).Seconds(), IndexesEqual: true,
		ReplicaRestarts: p.replicaRestarts, ServerRestarts: p.serverRestarts, HostileRefused: p.hostileRefused, SnapshotsRefused: p.snapshotsRefused,
		StreamResets: p.streamResets}
	for _, r := range append(slices.Clone(p.replicas), p.dead...) {
		if r.share != nil {
			out.ForgeriesDropped += r.share.Dropped()
		}
	}
	var lags []time.Duration
	for i, r := range p.replicas {
		if err := r.follow.CatchUp(ctx); err != nil {
			return out, 0, 0, err
		}
		if d := p.ref.DiffIndex(r.pool.Index()); d != "" {
			out.IndexesEqual = false
			fmt.Fprintf(progress, "%s: replica %d differs from the reference: %s\n", mode, i, d)
		}
		lags = append(lags, r.follow.Lags()...)
	}
	l := stats.Micros(lags)
	out.EventLagMs = msStats{P50: stats.Percentile(l, 0.5) / 1e3, P99: stats.Percentile(l, 0.99) / 1e3}
	fmt.Fprintf(progress, "%s: %d replicas, reuse %.3f, TTFT mean %.1f ms, %.1fs\n", mode, n, out.ReuseRatio, out.TTFTMs.Mean, out.ElapsedS)
	if !share {
		return out, 0, 0, nil
	}
	catchUp, pairs, err := c.catchUp(ctx, bus, p.replicas[0])
	return out, catchUp, pairs, err
}

// replica starts one router replica following the stream (and sharing its
// load when share).
func (c *clusterConfig) replica(ctx context.Context, url string, bus *cluster.Bus, loadSubject string, share bool, from uint64) (*clusterReplica, error) {
	r := &clusterReplica{pool: shardpool.NewPool(2, c.sim.BlockSize)}
	if from > 0 {
		got, err := bus.Restore(ctx, r.pool)
		if err != nil {
			r.pool.Close()
			return nil, err
		}
		from = got
	}
	cfg := router.DefaultConfig()
	cfg.BlockSize, cfg.MaxBatchedTokens, cfg.DPSize = c.sim.BlockSize, c.sim.MaxBatchedTokens, c.sim.DPSize
	if share {
		cfg.OnAdmit = func(id uuid.UUID, a router.Admission) { r.share.OnAdmit(id, a) }
	}
	var err error
	if r.router, err = router.NewWithIndexer(router.KV, cfg, c.sim.Workers, r.pool); err != nil {
		r.pool.Close()
		return nil, err
	}
	if r.follow, err = bus.Follow(ctx, r.pool, from); err != nil {
		r.router.Shutdown()
		return nil, err
	}
	if share {
		if r.share, err = cluster.NewShare(url, r.router, cluster.ShareConfig{Subject: loadSubject}); err != nil {
			r.close()
			return nil, err
		}
	}
	return r, nil
}

func (r *clusterReplica) close() {
	if r.killed {
		return
	}
	r.killed = true
	if r.share != nil {
		r.share.Close()
	}
	r.follow.Close()
	r.router.Shutdown()
}

// catchUp times a new replica joining from a snapshot of rep's index: the
// restore, then following the stream to its end.
func (c *clusterConfig) catchUp(ctx context.Context, bus *cluster.Bus, rep *clusterReplica) (float64, int, error) {
	if _, err := rep.follow.Snapshot(ctx, rep.pool.Index()); err != nil {
		return 0, 0, err
	}
	pool := shardpool.NewPool(2, c.sim.BlockSize)
	defer pool.Close()
	start := time.Now()
	from, err := bus.Restore(ctx, pool)
	if err != nil {
		return 0, 0, err
	}
	f, err := bus.Follow(ctx, pool, from)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	if err := f.CatchUp(ctx); err != nil {
		return 0, 0, err
	}
	return float64(time.Since(start).Microseconds()) / 1e3, pool.Index().Size(), nil
}

// Choose sends request i to replica i mod n, once that replica has applied
// every event published so far and (sharing load) heard every other
// replica's updates so far: the simulation's clock runs far faster than
// the wall clock, and on the trace's clock a millisecond's delay is none.
func (p *clusterPolicy) Choose(i int, req router.Request) (int, error) {
	if err := p.inject(i); err != nil {
		return 0, err
	}
	r := p.replicas[i%len(p.replicas)]
	if err := r.follow.CatchUp(p.ctx); err != nil {
		return 0, err
	}
	if err := p.heard(r); err != nil {
		return 0, err
	}
	w, err := r.router.SelectWorkerRank(r.decided, req)
	if errors.Is(err, context.Canceled) {
		return 0, replay.ErrQueued
	}
	if err != nil {
		return 0, err
	}
	p.owner[req.UUID] = r
	return int(w.ID)*max(p.dp, 1) + int(w.DPRank), nil
}

// heard flushes every replica's load updates and waits (a second at most:
// core NATS may drop a message) until r has applied the others'.
func (p *clusterPolicy) heard(r *clusterReplica) error {
	if r.share == nil {
		return nil
	}
	sent := make([]uint64, len(p.replicas))
	for k, o := range p.replicas {
		sent[k] = o.share.Flush()
	}
	deadline := time.Now().Add(time.Second)
	for k, o := range p.replicas {
		for o != r && r.share.HeardFrom(o.share.ID()) < sent[k] && time.Now().Before(deadline) {
			if err := p.ctx.Err(); err != nil {
				return err
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	return nil
}

// Sink publishes worker w's events to the stream (and to the reference).
func (p *clusterPolicy) Sink(w kvevent.WorkerID) router.EventSink { return clusterSink{p, w} }

type clusterSink struct {
	p *clusterPolicy
	w kvevent.WorkerID
}

func (s clusterSink) Publish(ev kvevent.Event) error {
	return s.PublishWithTier(ev, kvevent.TierDevice)
}

func (s clusterSink) PublishWithTier(ev kvevent.Event, tier kvevent.Tier) error {
	re := kvevent.RouterEvent{WorkerID: s.w, Tier: tier, Event: ev}
	_ = s.p.ref.Apply(re)
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// A re-send after a lost ack is dropped by the duplicate window.
		if _, err = s.p.bus.Publish(s.p.ctx, re); err == nil || s.p.ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil && s.p.failed == nil {
		s.p.failed = err
	}
	return err
}

// FirstToken and Complete go to the replica that admitted the request,
// through its load sharing if any.
func (p *clusterPolicy) FirstToken(id uuid.UUID) error {
	r := p.owner[id]
	if r == nil || r.killed {
		return nil
	}
	if r.share != nil {
		_, err := r.share.OnFirstToken(id)
		return err
	}
	_, err := r.router.OnFirstToken(id)
	return err
}

func (p *clusterPolicy) Complete(id uuid.UUID) error {
	r := p.owner[id]
	if r == nil || r.killed {
		delete(p.owner, id)
		return nil
	}
	delete(p.owner, id)
	if r.share != nil {
		_, err := r.share.OnComplete(id)
		return err
	}
	_, err := r.router.OnComplete(id)
	return err
}

func printCluster(w io.Writer, rep clusterReport) {
	fmt.Fprintf(w, "trace: %s; a new replica catches up from a snapshot (%d pairs) in %.1f ms\n\n", rep.Trace, rep.CatchUpPairs, rep.CatchUpMs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\treplicas\treuse\tTTFT mean ms\tTTFT p99 ms\tload cv\tevent lag p50 ms\tp99 ms\tindexes equal\tfaults\t")
	for _, r := range rep.Results {
		faults := "-"
		if rep.Faults {
			faults = fmt.Sprintf("%d replica, %d server restarts; hostile client refused %v, %d forgeries dropped; %d corrupt snapshots refused; %d stream resets",
				r.ReplicaRestarts, r.ServerRestarts, r.HostileRefused, r.ForgeriesDropped, r.SnapshotsRefused, r.StreamResets)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.1f\t%.1f\t%.3f\t%.2f\t%.2f\t%v\t%s\t\n", r.Mode, r.Replicas, r.ReuseRatio, r.TTFTMs.Mean, r.TTFTMs.P99,
			r.LoadCV, r.EventLagMs.P50, r.EventLagMs.P99, r.IndexesEqual, faults)
	}
	tw.Flush()
}

func printClusterBench(w io.Writer, rep clusterReport) {
	fmt.Fprintln(w, "pkg: github.com/kvradix/kvradix/cmd/loadgen")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "BenchmarkCluster/mode=%s/replicas=%d 1 %.0f ns/op %.4f reuse %.0f event-lag-p99-ns\n",
			r.Mode, r.Replicas, r.TTFTMs.Mean*1e6, r.ReuseRatio, r.EventLagMs.P99*1e6)
	}
}
