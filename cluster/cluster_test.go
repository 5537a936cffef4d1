package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kvradix/kvradix/cluster"
	"github.com/kvradix/kvradix/internal/leaks"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/shardpool"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaks.Ignore()...)
}

// events is a stream of n events of 4 workers with 2 ranks, from the
// conformance generator, and the reference holdings they make.
func events(n int, seed uint64) ([]kvevent.RouterEvent, radixtest.Holdings) {
	g := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, 7)), Model: radixtest.NewModel()}
	want := radixtest.Holdings{}
	var evs []kvevent.RouterEvent
	for len(evs) < n {
		op := g.Next()
		if op.Kind != radixtest.OpEvent {
			continue
		}
		_ = g.Model.Apply(op.Event)
		_ = want.Apply(op.Event)
		evs = append(evs, op.Event)
	}
	return evs, want
}

func setup(t testing.TB) (context.Context, *cluster.Server, *cluster.Bus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	srv, err := cluster.StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	bus, err := cluster.Connect(ctx, srv.URL(), cluster.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Close)
	return ctx, srv, bus
}

func follow(t *testing.T, ctx context.Context, bus *cluster.Bus, from uint64) (*cluster.Replica, *shardpool.Pool) {
	t.Helper()
	pool := shardpool.NewPool(2, 16)
	t.Cleanup(func() { pool.Close() })
	r, err := bus.Follow(ctx, pool, from)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, pool
}

func holds(t *testing.T, idx radix.Index, want radixtest.Holdings, who string) {
	t.Helper()
	got, err := radixtest.HoldingsOf(idx)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Diff(want); d != "" {
		t.Fatalf("%s differs from the reference: %s", who, d)
	}
}

// Two replicas follow one stream into their own indexes and converge to the
// reference built from every event; re-sent events (same worker, rank and
// id) are dropped by the server's duplicate window.
func TestReplicasConvergeDespiteDuplicates(t *testing.T) {
	ctx, _, bus := setup(t)
	evs, want := events(300, 1)
	a, poolA := follow(t, ctx, bus, 0)
	for i, ev := range evs {
		ev.Event.ID = uint64(i) + 1
		seq, err := bus.Publish(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 { // a re-send: the same message id
			again, err := bus.Publish(ctx, ev)
			if err != nil || again != seq {
				t.Fatalf("re-send of %d: seq %d (%v), want the original's %d", i, again, err, seq)
			}
		}
	}
	b, poolB := follow(t, ctx, bus, 0) // joins late, from the start
	for _, r := range []*cluster.Replica{a, b} {
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if r.Seq() != uint64(len(evs)) || r.Bad() != 0 {
			t.Fatalf("replica at %d with %d bad, want %d", r.Seq(), r.Bad(), len(evs))
		}
	}
	holds(t, poolA.Index(), want, "replica a")
	holds(t, poolB.Index(), want, "replica b")
}

// A replica restarted from a snapshot loads it and follows from the
// sequence after it: its index equals the reference built from every
// event, those after the snapshot included.
func TestRestartFromSnapshot(t *testing.T) {
	ctx, _, bus := setup(t)
	evs, want := events(400, 2)
	a, poolA := follow(t, ctx, bus, 0)
	publishAll(t, ctx, bus, evs[:250], 1)
	seq, err := a.Snapshot(ctx, poolA.Index())
	if err != nil || seq != 250 {
		t.Fatalf("snapshot at %d (%v), want 250", seq, err)
	}
	publishAll(t, ctx, bus, evs[250:], 251)
	pool := shardpool.NewPool(2, 16)
	defer pool.Close()
	from, err := bus.Restore(ctx, pool)
	if err != nil || from != 250 {
		t.Fatalf("restored at %d (%v), want 250", from, err)
	}
	r, err := bus.Follow(ctx, pool, from)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	holds(t, pool.Index(), want, "the restored replica")
	if err := a.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	holds(t, poolA.Index(), want, "the replica that stayed")
}

// No snapshot yet is an error of its own.
func TestRestoreWithoutSnapshot(t *testing.T) {
	ctx, _, bus := setup(t)
	pool := shardpool.NewPool(1, 16)
	defer pool.Close()
	if _, err := bus.Restore(ctx, pool); err != cluster.ErrNoSnapshot {
		t.Fatalf("%v, want ErrNoSnapshot", err)
	}
}

// The server restarts (JetStream on disk, same port): the replica's
// connection and consumer come back, nothing published before is lost, and
// it converges with what is published after.
func TestServerRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := cluster.StartEmbedded(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	bus, err := cluster.Connect(ctx, srv.URL(), cluster.Config{})
	if err != nil {
		srv.Shutdown()
		t.Fatal(err)
	}
	defer bus.Close()
	evs, want := events(300, 3)
	r, pool := follow(t, ctx, bus, 0)
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			ev := evs[i]
			ev.Event.ID = uint64(i) + 1
			for {
				if _, err := bus.Publish(ctx, ev); err == nil {
					break
				} else if ctx.Err() != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond) // reconnecting
			}
		}
	}
	publish(0, 150)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	srv, err = cluster.StartEmbeddedOn(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	publish(150, 300)
	for r.Seq() < 300 {
		select {
		case <-ctx.Done():
			t.Fatalf("replica stuck at %d of 300", r.Seq())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	holds(t, pool.Index(), want, "the replica across a server restart")
}

// Retention dropped the events after a replica's snapshot: following from
// it is refused with the gap named, never served silently incomplete; a
// fresh snapshot makes the replica whole again.
func TestRetentionGap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := cluster.StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	bus, err := cluster.Connect(ctx, srv.URL(), cluster.Config{MaxMsgs: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	evs, want := events(300, 4)
	a, poolA := follow(t, ctx, bus, 0)
	for i, ev := range evs {
		ev.Event.ID = uint64(i) + 1
		if _, err := bus.Publish(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if i == 49 {
			if _, err := a.Snapshot(ctx, poolA.Index()); err != nil {
				t.Fatal(err)
			}
		}
	}
	pool := shardpool.NewPool(1, 16)
	defer pool.Close()
	from, err := bus.Restore(ctx, pool)
	if err != nil || from != 50 {
		t.Fatalf("restored at %d (%v)", from, err)
	}
	var gap *cluster.RetentionGapError
	if _, err := bus.Follow(ctx, pool, from); !errors.As(err, &gap) || gap.From != 50 || gap.FirstHeld != 201 || bus.RetentionGaps() != 1 {
		t.Fatalf("follow across the gap: %v (%d counted)", err, bus.RetentionGaps())
	}
	// Join waits for a snapshot past the gap, written periodically by the
	// replica that followed all along, and rebuilds from it.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	joined := make(chan error, 1)
	var fresh shardpool.Indexer
	var r *cluster.Replica
	go func() {
		var err error
		r, fresh, err = bus.Join(ctx, func() shardpool.Indexer { return shardpool.NewPool(1, 16) }, 20*time.Second)
		joined <- err
	}()
	testwait.For(t, "Join to meet the gap", func() bool { return bus.RetentionGaps() >= 2 })
	a.SnapshotEvery(sctx, poolA.Index(), 20*time.Millisecond, func(err error) { t.Error(err) })
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	stop()
	defer r.Close()
	defer fresh.Close()
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if bus.RetentionGaps() < 2 {
		t.Fatalf("%d retention gaps counted, want Join's too", bus.RetentionGaps())
	}
	pool2, ok := fresh.(*shardpool.Pool)
	if !ok {
		t.Fatalf("%T", fresh)
	}
	holds(t, pool2.Index(), want, "the replica rebuilt from a fresh snapshot")
}

// Two replicas share load: a request admitted on one is counted on the
// other, which then sends the next equal request to the other worker; a
// completion releases it everywhere; a replica that goes silent has its
// load dropped after the timeout.
func TestSharedLoad(t *testing.T) {
	_, srv, _ := setup(t)
	newReplica := func() (*router.Router, *cluster.Share) {
		var sh *cluster.Share
		cfg := router.DefaultConfig()
		cfg.BlockSize = 4
		cfg.OnAdmit = func(id uuid.UUID, a router.Admission) { sh.OnAdmit(id, a) }
		r, err := router.New(router.KV, cfg, 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Shutdown() })
		if sh, err = cluster.NewShare(srv.URL(), r, cluster.ShareConfig{Timeout: 500 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		return r, sh
	}
	a, shA := newReplica()
	b, shB := newReplica()
	defer shB.Close()
	testwait.For(t, "the replicas to hear each other", func() bool { return shA.Replicas() == 1 && shB.Replicas() == 1 })
	tokens := func(start uint32) []uint32 {
		out := make([]uint32, 64)
		for i := range out {
			out[i] = start + uint32(i)
		}
		return out
	}
	ctx := context.Background()
	x := uuid.New()
	w, err := a.SelectWorkerRank(ctx, router.Request{UUID: x, Tokens: tokens(1)})
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "b to count a's request", func() bool { return b.Stats().Active == 1 })
	y := uuid.New()
	if got, err := b.SelectWorkerRank(ctx, router.Request{UUID: y, Tokens: tokens(5000)}); err != nil || got == w {
		t.Fatalf("b sent an equal request to %v (%v), where a's request runs", got, err)
	}
	if _, err := shA.OnComplete(x); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "a's completion to reach b", func() bool { return b.Stats().Active == 1 }) // y is b's own
	testwait.For(t, "b's admission to reach a", func() bool { return a.Stats().Active == 1 })
	// b goes silent: a drops b's load after the timeout.
	shB.Close()
	testwait.For(t, "a to drop the silent replica's load", func() bool { return a.Stats().Active == 0 && shA.Replicas() == 0 })
	shA.Close()
}

// The embedded server admits only its token: a local client with the bare
// address, or another token, cannot connect, so it can publish, purge and
// delete nothing; the URL it hands out carries the token, and a server
// restarted on its directory keeps it.
func TestEmbeddedServerRequiresItsToken(t *testing.T) {
	ctx, srv, bus := setup(t)
	u, err := url.Parse(srv.URL())
	if err != nil || u.User == nil || u.User.Username() == "" {
		t.Fatalf("URL %q carries no token", srv.URL())
	}
	bare := *u
	bare.User = nil
	wrong := *u
	wrong.User = url.User("not-the-token")
	for _, addr := range []string{bare.String(), wrong.String()} {
		if nc, err := nats.Connect(addr, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatalf("a client connected to %s", addr)
		}
		if b, err := cluster.Connect(ctx, addr, cluster.Config{}); err == nil {
			b.Close()
			t.Fatalf("cluster.Connect to %s succeeded", addr)
		}
	}
	if _, err := bus.Publish(ctx, kvevent.RouterEvent{WorkerID: 1, Event: kvevent.Event{ID: 1, Data: kvevent.Cleared{}}}); err != nil {
		t.Fatalf("the token's client cannot publish: %v", err)
	}
	// The same token through Auth, for a cluster whose URL carries none.
	b, err := cluster.Connect(ctx, bare.String(), cluster.Config{Auth: cluster.Auth{Token: u.User.Username()}})
	if err != nil {
		t.Fatalf("Connect with Auth.Token: %v", err)
	}
	b.Close()
}

// A wrong token's connect error does not echo the token (it carried the
// URL whole), and Redact hides credentials in every URL of a list.
func TestConnectErrorsHideTheToken(t *testing.T) {
	ctx, srv, _ := setup(t)
	u, _ := url.Parse(srv.URL())
	u.User = url.User("s3cret-token")
	if _, err := cluster.Connect(ctx, u.String(), cluster.Config{}); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("connect with a wrong token: %v", err)
	}
	for in, want := range map[string]string{
		"nats://tok@h:1":                 "nats://REDACTED@h:1",
		"nats://u:p@h:1,tls://t@g:2":     "nats://REDACTED@h:1,tls://REDACTED@g:2",
		"nats://h:1":                     "nats://h:1",
		"nats://a@b@h:1":                 "nats://REDACTED@h:1",
		"embedded":                       "embedded",
		"nats://127.0.0.1:4222,h2:4222/": "nats://127.0.0.1:4222,h2:4222/",
	} {
		if got := cluster.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// An embedded server restarted on its directory comes back on its port:
// the other replicas, connected to that port, reconnect (on a new one they
// never would).
func TestEmbeddedServerKeepsItsPort(t *testing.T) {
	dir := t.TempDir()
	srv, err := cluster.StartEmbedded(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	srv.Shutdown()
	srv, err = cluster.StartEmbedded(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if srv.Port() != port {
		t.Fatalf("restarted on port %d, was %d", srv.Port(), port)
	}
}

// A peer with the server's token but no good intent forges load messages:
// completions and first tokens of another replica's requests from a
// made-up replica, admissions with a prompt of 2^40 tokens, garbage, and
// messages claiming the victim's own id. None of it changes the victim's
// load: its requests stay counted and complete normally after, its
// decisions still use worker 0, and every refused message or op is
// counted.
func TestForgedLoadChangesNothing(t *testing.T) {
	_, srv, _ := setup(t)
	var sh *cluster.Share
	cfg := router.DefaultConfig()
	cfg.BlockSize = 4
	cfg.OnAdmit = func(id uuid.UUID, a router.Admission) { sh.OnAdmit(id, a) }
	r, err := router.New(router.KV, cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown()
	if sh, err = cluster.NewShare(srv.URL(), r, cluster.ShareConfig{Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	ctx := context.Background()
	var own []uuid.UUID
	for i := range 10 {
		id := uuid.New()
		if _, err := r.SelectWorkerRank(ctx, router.Request{UUID: id, Tokens: []uint32{uint32(i), 1, 2, 3, 4}, MaxOutputTokens: 8}); err != nil {
			t.Fatal(err)
		}
		own = append(own, id)
	}
	forger, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	send := func(replica uuid.UUID, ops ...map[string]any) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"r": replica, "s": 1, "ops": ops})
		if err := forger.Publish("kv.load", b); err != nil {
			t.Fatal(err)
		}
	}
	madeUp := uuid.New()
	var ops []map[string]any
	for _, id := range own {
		ops = append(ops, map[string]any{"k": 'f', "id": id}, map[string]any{"k": 'c', "id": id})
	}
	send(madeUp, ops...) // 20 refused ops
	ops = nil
	for range 20 {
		ops = append(ops, map[string]any{"k": 'a', "id": uuid.New(), "a": map[string]any{
			"worker": map[string]any{"ID": 0}, "isl": int64(1) << 40, "blocks": []uint64{}, "overlap": 0}})
	}
	send(madeUp, ops...)                                                  // 20 refused admissions
	send(sh.ID(), map[string]any{"k": 'c', "id": own[0]})                 // claims the victim's id: 1
	if err := forger.Publish("kv.load", []byte("{garbage")); err != nil { // 1
		t.Fatal(err)
	}
	testwait.For(t, "the forgeries to be counted", func() bool { return sh.Dropped() >= 42 })
	if got := r.Stats().Active; got != 10 {
		t.Fatalf("%d requests active after the forgeries, want the victim's 10", got)
	}
	workers := map[int]int{}
	for i := range 200 {
		id := uuid.New()
		w, err := r.SelectWorker(ctx, router.Request{UUID: id, Tokens: []uint32{uint32(1000 + i), 5, 6, 7, 8}, MaxOutputTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		workers[w]++
		if _, err := r.OnComplete(id); err != nil {
			t.Fatal(err)
		}
	}
	if workers[0] == 0 {
		t.Fatalf("worker 0 got none of 200 decisions (%v): forged load steered routing", workers)
	}
	for _, id := range own {
		if _, err := sh.OnComplete(id); err != nil {
			t.Fatalf("the victim's own completion of %v: %v", id, err)
		}
	}
}

// A replica keeps the lags of its latest LagWindow events only: memory a
// long-running follower spends on them is bounded.
func TestReplicaLagsBounded(t *testing.T) {
	ctx, srv, _ := setup(t)
	bus, err := cluster.Connect(ctx, srv.URL(), cluster.Config{Stream: "LAGS", Subject: "lags", Bucket: "LAGSNAP", LagWindow: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	pool := shardpool.NewPool(1, 16)
	defer pool.Close()
	r, err := bus.Follow(ctx, pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 180 {
		ev := kvevent.RouterEvent{WorkerID: 1, Event: kvevent.Event{ID: uint64(i) + 1, Data: kvevent.Cleared{}}}
		if _, err := bus.Publish(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(r.Lags()); n != 50 {
		t.Fatalf("%d lags kept after 180 events, want the window's 50", n)
	}
}

// Following from a sequence past the stream's last (a forged or stale
// position, up to 2^64-1, where from+1 wraps) is refused, not a replica
// waiting forever for events that never come.
func TestFollowPastTheStreamIsRefused(t *testing.T) {
	ctx, _, bus := setup(t)
	if _, err := bus.Publish(ctx, kvevent.RouterEvent{WorkerID: 1, Event: kvevent.Event{ID: 1, Data: kvevent.Cleared{}}}); err != nil {
		t.Fatal(err)
	}
	pool := shardpool.NewPool(1, 16)
	defer pool.Close()
	for _, from := range []uint64{2, 1000, 1 << 63, math.MaxUint64} {
		r, err := bus.Follow(ctx, pool, from)
		if err == nil {
			r.Close()
			t.Fatalf("followed from %d, past the stream's last (1)", from)
		}
		if !strings.Contains(err.Error(), "past the stream's last sequence 1") {
			t.Fatalf("from %d: %v", from, err)
		}
	}
	r, err := bus.Follow(ctx, pool, 1)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
}

// The server restarts without its data (same port and credentials): the
// bus re-creates the stream when it publishes again; a replica that was at
// 60 finds the stream ending below it and says so (CatchUp's and Err's
// StreamResetError, counted), instead of staying quiet at 60 while the new
// events pass it by; Join then starts clean (the snapshot is past the new
// stream's end) and the new replica holds the new stream's events.
func TestLostStreamIsDetectedAndRejoined(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := cluster.StartEmbedded(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	bus, err := cluster.Connect(ctx, srv.URL(), cluster.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	evs, _ := events(90, 5)
	a, poolA := follow(t, ctx, bus, 0)
	publishAll(t, ctx, bus, evs[:60], 1)
	if _, err := a.Snapshot(ctx, poolA.Index()); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	fresh := t.TempDir() // the data is gone; the credentials are kept
	token, err := os.ReadFile(filepath.Join(dir, "auth-token"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fresh, "auth-token"), token, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err = cluster.StartEmbeddedOn(fresh, port)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	want := radixtest.Holdings{}
	for i, ev := range evs[60:] {
		ev.Event.ID = uint64(1000 + i)
		var err error
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err = bus.Publish(ctx, ev); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("publish after the server lost its data: %v", err)
		}
		_ = want.Apply(ev)
	}
	if bus.Recreated() == 0 {
		t.Fatal("the bus did not re-create the stream")
	}
	var reset *cluster.StreamResetError
	if err := a.CatchUp(ctx); !errors.As(err, &reset) || reset.At != 60 || reset.Last != 30 {
		t.Fatalf("CatchUp of the replica at 60: %v, want a StreamResetError at 60, last 30", err)
	}
	if !errors.As(a.Err(), &reset) || bus.StreamResets() != 1 {
		t.Fatalf("Err %v, %d resets counted", a.Err(), bus.StreamResets())
	}
	joinHolds(t, ctx, bus, want, "the rejoined replica")
}

// joinHolds joins a new replica (Join: the newest usable snapshot, or a
// clean start), catches it up and checks it holds want.
func joinHolds(t *testing.T, ctx context.Context, bus *cluster.Bus, want radixtest.Holdings, what string) {
	t.Helper()
	r, idx, err := bus.Join(ctx, func() shardpool.Indexer { return shardpool.NewPool(2, 16) }, time.Second)
	if err != nil {
		t.Fatalf("%s: Join: %v", what, err)
	}
	defer idx.Close()
	defer r.Close()
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if d := want.DiffIndex(idx.(*shardpool.Pool).Index()); d != "" {
		t.Fatalf("%s: %s", what, d)
	}
}

// publishAll publishes evs in order, numbering them from firstID.
func publishAll(t *testing.T, ctx context.Context, bus *cluster.Bus, evs []kvevent.RouterEvent, firstID uint64) {
	t.Helper()
	for i, ev := range evs {
		ev.Event.ID = firstID + uint64(i)
		if _, err := bus.Publish(ctx, ev); err != nil {
			t.Fatalf("publish event %d: %v", ev.Event.ID, err)
		}
	}
}

// The stream is deleted (the bucket stays): the bus re-creates it on the
// next publish, the snapshot left in the bucket is past the new stream's
// end, and Join starts clean instead of refusing or restoring it.
func TestJoinStartsCleanAfterTheStreamIsRecreated(t *testing.T) {
	ctx, srv, bus := setup(t)
	evs, _ := events(40, 6)
	a, poolA := follow(t, ctx, bus, 0)
	publishAll(t, ctx, bus, evs[:30], 1)
	if _, err := a.Snapshot(ctx, poolA.Index()); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "KVEVENTS"); err != nil {
		t.Fatal(err)
	}
	publishAll(t, ctx, bus, evs[30:], 100) // the bus re-creates the stream
	want := radixtest.Holdings{}
	for _, ev := range evs[30:] {
		_ = want.Apply(ev)
	}
	joinHolds(t, ctx, bus, want, "the replica joined after the reset")
}

// With the server gone for good, CatchUp gives up after Config.Patience,
// whatever a single request to the server takes (it ran 10 s past its
// documented 30 s).
func TestCatchUpKeepsItsPatience(t *testing.T) {
	ctx, srv, _ := setup(t)
	bus, err := cluster.Connect(ctx, srv.URL(), cluster.Config{Stream: "PATIENT", Subject: "patient", Bucket: "PATIENTSNAP", Patience: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	r, _ := follow(t, ctx, bus, 0)
	srv.Shutdown()
	start := time.Now()
	if err := r.CatchUp(ctx); err == nil {
		t.Fatal("caught up with no server")
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("CatchUp gave up after %v with a patience of 1s", took)
	}
}
