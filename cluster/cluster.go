// Package cluster runs kvradix router replicas over NATS JetStream, so that
// several routers share one truth about the workers' caches.
//
// Engines (or an ingest subscriber) publish their RouterEvents to one
// stream, one subject per worker and rank, each with a message id (worker,
// rank, event id) so that the server's duplicate window drops re-sends.
// Every replica follows the whole stream in order into its own indexer
// (Follow), and writes snapshots of its index with the stream sequence they
// reflect to an object store (Snapshot); a new or restarted replica starts
// from the newest snapshot and follows from the next sequence (Restore).
//
// The server is embedded by default (StartEmbedded: a random loopback
// port, JetStream on a directory of the caller's), or any NATS cluster by
// URL.
//
// Replicas share their in-flight load over core NATS (Share). Nothing is
// taken on trust: the embedded server admits only its token, a replica
// changes only the load another admitted within a router's bounds, and a
// snapshot is checked whole before it is applied.
package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvradix/kvradix/internal/ctxwait"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/shardpool"
)

// Server is an embedded NATS server with JetStream. It admits only clients
// that present its token: any local process could otherwise publish
// events every replica applies, forge load, or purge and delete the
// stream and the snapshots.
type Server struct {
	s     *server.Server
	token string
}

// StartEmbedded starts a NATS server on a loopback port with JetStream
// storing under dir, requiring a token (see StartEmbeddedOn). The port is
// random the first time and kept in dir's portFile: a server restarted on
// its directory comes back on the same port, where the other replicas'
// connections reconnect (on a new one they never would).
func StartEmbedded(dir string) (*Server, error) {
	port := server.RANDOM_PORT
	if b, err := os.ReadFile(filepath.Join(dir, portFile)); err == nil {
		p, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || p <= 0 || p > 65535 {
			return nil, fmt.Errorf("cluster: %s: %q is not a port", filepath.Join(dir, portFile), b)
		}
		port = p
	}
	s, err := StartEmbeddedOn(dir, port)
	if err != nil {
		return nil, err
	}
	if port == server.RANDOM_PORT {
		if err := os.WriteFile(filepath.Join(dir, portFile), []byte(strconv.Itoa(s.Port())+"\n"), 0o600); err != nil {
			s.Shutdown()
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}
	return s, nil
}

// portFile is where an embedded server keeps its port, in its directory.
const portFile = "port"

// StartEmbeddedOn is StartEmbedded on a given loopback port: a server
// restarted on its port and directory keeps its streams, and clients
// reconnect to it. The server requires the token in dir's tokenFile,
// written (0600, 32 random bytes) on the first start and read on a
// restart, so that reconnecting clients are admitted again.
func StartEmbeddedOn(dir string, port int) (*Server, error) {
	token, err := serverToken(dir)
	if err != nil {
		return nil, err
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true, Authorization: token})
	if err != nil {
		return nil, fmt.Errorf("cluster: nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("cluster: nats server not ready within 10s")
	}
	return &Server{s: s, token: token}, nil
}

// tokenFile is where an embedded server keeps its token, in its directory.
const tokenFile = "auth-token"

// serverToken reads dir's token, or makes one.
func serverToken(dir string) (string, error) {
	path := filepath.Join(dir, tokenFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil && len(bytes.TrimSpace(b)) > 0:
		return string(bytes.TrimSpace(b)), nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("cluster: server token: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("cluster: server token: %w", err)
	}
	token := hex.EncodeToString(raw)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("cluster: server token: %w", err)
	}
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("cluster: server token: %w", err)
	}
	return token, nil
}

// URL is the server's client URL, carrying its token: Connect and NewShare
// given it are admitted; the bare address is refused.
func (s *Server) URL() string {
	u, err := url.Parse(s.s.ClientURL())
	if err != nil { // the server's own URL always parses
		return s.s.ClientURL()
	}
	u.User = url.User(s.token)
	return u.String()
}

// Port is the server's client port.
func (s *Server) Port() int { return s.s.Addr().(*net.TCPAddr).Port }

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown() {
	s.s.Shutdown()
	s.s.WaitForShutdown()
}

// Auth is how a client proves itself to a NATS server: the embedded
// server's URL carries its token already; a real cluster takes any of
// these (empty fields are not sent). TLS is used when RootCA or a client
// certificate is given, or the URL's scheme is tls://.
type Auth struct {
	Token     string // a server token
	User      string // with Password
	Password  string
	CredsFile string // a JWT and nkey seed .creds file
	RootCA    string // PEM file of the CA the server's certificate chains to
	CertFile  string // client certificate (PEM), with KeyFile, for mutual TLS
	KeyFile   string
}

// options returns the nats options for a, after common.
func (a Auth) options(common ...nats.Option) []nats.Option {
	opts := common
	if a.Token != "" {
		opts = append(opts, nats.Token(a.Token))
	}
	if a.User != "" {
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	}
	if a.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	if a.RootCA != "" {
		opts = append(opts, nats.RootCAs(a.RootCA))
	}
	if a.CertFile != "" || a.KeyFile != "" {
		opts = append(opts, nats.ClientCert(a.CertFile, a.KeyFile))
	}
	return opts
}

// Config names the stream and the snapshot bucket.
type Config struct {
	Auth                    // credentials and TLS for the NATS server
	Stream    string        // the events' stream ("KVEVENTS")
	Subject   string        // subject prefix; events go to <prefix>.<worker>.<rank> ("kv.events")
	Bucket    string        // the snapshots' object store ("KVSNAPSHOTS")
	Duplicate time.Duration // the server's duplicate window (2m)
	MaxMsgs   int64         // retention: messages kept (0: no limit)
	// MaxAge and MaxBytes bound the stream (0: no limit): the oldest
	// events go first. A replica joining later starts from the latest
	// snapshot and follows the stream from the snapshot's sequence, so the
	// bound must keep several snapshot intervals of events: a follow from
	// further back is refused (RetentionGapError), never served with
	// events missing.
	MaxAge    time.Duration
	MaxBytes  int64
	LagWindow int           // how many of the latest events' lags a replica keeps (65536)
	Patience  time.Duration // how long a call waits out a server away (restarting) before it errs (30s)
	// Metadata is recorded on the stream, for ListStreams to find (what
	// the stream indexes, say).
	Metadata map[string]string
}

func (c *Config) defaults() {
	if c.Stream == "" {
		c.Stream = "KVEVENTS"
	}
	if c.Subject == "" {
		c.Subject = "kv.events"
	}
	if c.Bucket == "" {
		c.Bucket = "KVSNAPSHOTS"
	}
	if c.Duplicate <= 0 {
		c.Duplicate = 2 * time.Minute
	}
	if c.LagWindow <= 0 {
		c.LagWindow = 1 << 16
	}
	if c.Patience <= 0 {
		c.Patience = 30 * time.Second
	}
}

// Bus is a connection to the stream and the snapshot store.
type Bus struct {
	gaps      atomic.Uint64 // follows refused for a retention gap
	resets    atomic.Uint64 // replicas that found their stream re-created or purged below them
	recreated atomic.Uint64 // times the bus re-created a missing stream
	cfg       Config
	nc        *nats.Conn
	js        jetstream.JetStream
	stream    jetstream.Stream
	snaps     jetstream.ObjectStore
}

// Connect connects to the NATS server at url and creates (or updates) the
// stream and the snapshot bucket.
func Connect(ctx context.Context, url string, cfg Config) (*Bus, error) {
	cfg.defaults()
	nc, err := dial(url, cfg.Auth)
	if err != nil {
		return nil, err
	}
	b := &Bus{cfg: cfg, nc: nc}
	if err := b.open(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return b, nil
}

// dial connects to the server at url, reconnecting for good.
func dial(url string, auth Auth) (*nats.Conn, error) {
	nc, err := nats.Connect(url, auth.options(nats.Timeout(5*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))...)
	if err != nil {
		return nil, fmt.Errorf("cluster: connect %s: %w", Redact(url), err)
	}
	return nc, nil
}

// Redact returns a server URL (or a comma-separated list) with any
// credentials in it (a token or user:password) replaced by "REDACTED",
// for messages: a connect error never echoes the bus's secret.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		scheme, rest, ok := strings.Cut(p, "://")
		if !ok {
			continue
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			parts[i] = scheme + "://REDACTED@" + rest[at+1:]
		}
	}
	return strings.Join(parts, ",")
}

func (b *Bus) open(ctx context.Context) error {
	js, err := jetstream.New(b.nc)
	if err != nil {
		return err
	}
	b.js = js
	b.stream, err = js.CreateOrUpdateStream(ctx, b.streamConfig())
	if err != nil {
		return fmt.Errorf("cluster: stream %s: %w", b.cfg.Stream, err)
	}
	b.snaps, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: b.cfg.Bucket, Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("cluster: snapshot bucket %s: %w", b.cfg.Bucket, err)
	}
	return nil
}

func (b *Bus) streamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: b.cfg.Stream, Subjects: []string{b.cfg.Subject + ".>"}, Duplicates: b.cfg.Duplicate,
		Storage: jetstream.FileStorage, MaxMsgs: b.cfg.MaxMsgs, MaxAge: b.cfg.MaxAge, MaxBytes: b.cfg.MaxBytes, Metadata: b.cfg.Metadata,
	}
}

// recreate re-creates the stream and the bucket after a server lost them
// (restarted without its data): the handles name them, so they work again.
func (b *Bus) recreate(ctx context.Context) error {
	if _, err := b.js.CreateOrUpdateStream(ctx, b.streamConfig()); err != nil {
		return fmt.Errorf("cluster: re-create stream %s: %w", b.cfg.Stream, err)
	}
	if _, err := b.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: b.cfg.Bucket, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("cluster: re-create snapshot bucket %s: %w", b.cfg.Bucket, err)
	}
	b.recreated.Add(1)
	return nil
}

// Recreated counts the times the bus re-created its missing stream.
func (b *Bus) Recreated() uint64 { return b.recreated.Load() }

// StreamResets counts replicas that found their stream re-created or
// purged below their position (StreamResetError).
func (b *Bus) StreamResets() uint64 { return b.resets.Load() }

// Close closes the connection.
func (b *Bus) Close() { b.nc.Close() }

// RetentionGaps counts the follows refused for a retention gap.
func (b *Bus) RetentionGaps() uint64 { return b.gaps.Load() }

// Publish publishes ev to its worker's subject, with the message id the
// server's duplicate window drops re-sends by; it returns the stream
// sequence (a duplicate gets the original's).
func (b *Bus) Publish(ctx context.Context, ev kvevent.RouterEvent) (uint64, error) {
	subject := fmt.Sprintf("%s.%d.%d", b.cfg.Subject, ev.WorkerID, ev.Event.DPRank)
	id := fmt.Sprintf("%d.%d.%d", ev.WorkerID, ev.Event.DPRank, ev.Event.ID)
	ack, err := b.js.Publish(ctx, subject, ev.AppendJSON(nil), jetstream.WithMsgID(id))
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		// No stream takes the subject: the server lost it. Make it again.
		if rerr := b.recreate(ctx); rerr != nil {
			return 0, rerr
		}
		ack, err = b.js.Publish(ctx, subject, ev.AppendJSON(nil), jetstream.WithMsgID(id))
	}
	if err != nil {
		return 0, fmt.Errorf("cluster: publish %s: %w", id, err)
	}
	return ack.Sequence, nil
}

// Replica follows the stream into its indexer.
type Replica struct {
	b    *Bus
	idx  shardpool.Indexer
	cc   jetstream.ConsumeContext
	seq  atomic.Uint64 // the last stream sequence applied
	bad  atomic.Uint64 // messages that did not decode
	snap atomic.Uint64 // the sequence of the last snapshot written
	mu   sync.Mutex
	lags []time.Duration // from storing in the stream to the hand-over to the indexer: a ring of the latest
	next int             // where the next lag goes, once the ring is full
	err  error           // why the replica can follow no more (see Err)
}

// StreamResetError is CatchUp's error when the stream no longer reaches
// the replica's position: it was re-created (a server restarted without
// its data) or purged below it. The replica's index reflects a stream that
// is gone and cannot follow the new one: Join again, which restores the
// newest snapshot the stream reaches, or starts clean.
type StreamResetError struct {
	At       uint64 // the replica's position
	Last     uint64 // the stream's last sequence
	FirstSeq uint64 // the stream's first sequence still held
}

func (e *StreamResetError) Error() string {
	return fmt.Sprintf("cluster: the replica is at %d, the stream holds %d..%d: it was re-created or purged below the replica", e.At, e.FirstSeq, e.Last)
}

// Err returns why the replica can follow no more (a *StreamResetError), or
// nil.
func (r *Replica) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// fail records, once, why the replica can follow no more.
func (r *Replica) fail(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
		r.b.resets.Add(1)
	}
	return r.err
}

// RetentionGapError is Follow's error when the stream no longer holds the
// sequence after from: following would serve an index silently missing the
// events between. Rebuild from a newer snapshot, or from the start of a
// stream that keeps everything.
type RetentionGapError struct {
	From      uint64 // the last sequence the index reflects
	FirstHeld uint64 // the stream's first sequence still held
}

func (e *RetentionGapError) Error() string {
	return fmt.Sprintf("cluster: the stream starts at %d, after %d: events %d..%d are gone", e.FirstHeld, e.From, e.From+1, e.FirstHeld-1)
}

// Follow applies every event of the stream after sequence from, in order,
// to idx, until Close. If the stream no longer holds the sequence after
// from, it refuses with a *RetentionGapError.
func (b *Bus) Follow(ctx context.Context, idx shardpool.Indexer, from uint64) (*Replica, error) {
	st, err := b.state(ctx) // re-creates a stream the server lost
	if err != nil {
		return nil, err
	}
	// Compared without from+1, which wraps at 2^64-1.
	if first := st.FirstSeq; st.Msgs > 0 && first > 1 && from < first-1 {
		b.gaps.Add(1)
		return nil, &RetentionGapError{From: from, FirstHeld: first}
	}
	if last := st.LastSeq; from > last {
		return nil, fmt.Errorf("cluster: follow from %d, past the stream's last sequence %d: its events would never come", from, last)
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from+1
	}
	cons, err := b.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cluster: follow %s from %d: %w", b.cfg.Stream, from, err)
	}
	r := &Replica{b: b, idx: idx}
	r.seq.Store(from)
	r.cc, err = cons.Consume(r.handle)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Replica) handle(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		r.bad.Add(1)
		return
	}
	var ev kvevent.RouterEvent
	if err := ev.UnmarshalJSON(msg.Data()); err != nil {
		r.bad.Add(1)
	} else if err := r.idx.ApplyEvent(ev); err != nil {
		r.bad.Add(1)
	}
	r.mu.Lock()
	if lag := time.Since(meta.Timestamp); len(r.lags) < r.b.cfg.LagWindow {
		r.lags = append(r.lags, lag)
	} else {
		r.lags[r.next] = lag
		r.next = (r.next + 1) % len(r.lags)
	}
	r.mu.Unlock()
	r.seq.Store(meta.Sequence.Stream)
}

// Lags returns, for the latest events the replica applied (at most
// Config.LagWindow: a replica follows for days at 50k events a second, and
// kept one lag an event, 1.4 GB an hour), oldest first, the time from each
// one's storing in the stream to its hand-over to the indexer.
func (r *Replica) Lags() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(slices.Clone(r.lags[r.next:]), r.lags[:r.next]...)
}

// Seq is the last stream sequence the replica applied (handed to its
// indexer).
func (r *Replica) Seq() uint64 { return r.seq.Load() }

// Bad counts messages that did not decode or apply.
func (r *Replica) Bad() uint64 { return r.bad.Load() }

// CatchUp waits until the replica has applied the stream's last message
// (and its indexer has applied it), or ctx ends.
func (r *Replica) CatchUp(ctx context.Context) error {
	if err := r.Err(); err != nil {
		return err
	}
	before := r.seq.Load()
	st, err := r.b.state(ctx)
	if err != nil {
		return err
	}
	last, at := st.LastSeq, r.seq.Load()
	// Reset: the stream ends below where the replica stood before asking,
	// or the events it had yet to apply since were purged (they will never
	// come). The replica moves on while the server answers: its position
	// read after the answer may be past the answer's last sequence (a
	// false reset, seen), and one read before may be below a purge it had
	// already passed.
	if last < before || (at < last && st.FirstSeq > at+1) {
		return r.fail(&StreamResetError{At: at, Last: last, FirstSeq: st.FirstSeq})
	}
	for r.seq.Load() < last {
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: replica at %d of %d: %w", r.seq.Load(), last, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	_, err = r.idx.Flush()
	return err
}

// Close stops following.
func (r *Replica) Close() { r.cc.Stop() }

// LastSeq returns the stream's last sequence, waiting out a server away
// (restarting, say) for at most Config.Patience, and re-creating the
// stream if the server lost it.
func (b *Bus) LastSeq(ctx context.Context) (uint64, error) {
	st, err := b.state(ctx)
	return st.LastSeq, err
}

// state returns the stream's state as LastSeq does. Every request to the
// server is given the time left, so that the whole wait stays within
// Patience (a request started near its end used to run past it by its
// own timeout).
func (b *Bus) state(ctx context.Context) (jetstream.StreamState, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Patience)
	defer cancel()
	for {
		info, err := b.stream.Info(ctx)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if err = b.recreate(ctx); err == nil {
				continue
			}
		}
		if err == nil {
			return info.State, nil
		}
		if !ctxwait.Sleep(ctx, 20*time.Millisecond) {
			return jetstream.StreamState{}, fmt.Errorf("cluster: stream %s: %w", b.cfg.Stream, err)
		}
	}
}

// LastSnapshot is the stream sequence of the last snapshot this replica
// wrote (0: none).
func (r *Replica) LastSnapshot() uint64 { return r.snap.Load() }

// SnapshotEvery writes a snapshot every interval until ctx ends (errors
// are reported to onErr, if set, and the next tick tries again).
func (r *Replica) SnapshotEvery(ctx context.Context, idx radix.Index, interval time.Duration, onErr func(error)) {
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := r.Snapshot(ctx, idx); err != nil && onErr != nil && ctx.Err() == nil {
					onErr(err)
				}
			}
		}
	}()
}

// snapshot reads the newest snapshot. Another replica may be replacing it
// meanwhile (its old chunks go as the new ones land), so a read that fails
// or stalls is tried again, three times, ten seconds each at most.
func (b *Bus) snapshot(ctx context.Context) ([]byte, error) {
	var err error
	for range 3 {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var data []byte
		data, err = b.snaps.GetBytes(actx, snapshotName)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound):
			return nil, b.noSnapshot(ctx)
		case err == nil:
			return data, nil
		case ctx.Err() != nil:
			return nil, err
		}
	}
	return nil, fmt.Errorf("cluster: read snapshot: %w", err)
}

// noSnapshot tells a bucket that never held a snapshot (ErrNoSnapshot)
// from one whose snapshot cannot be found though its data is there (its
// description lost on disk, say): corruption, not an empty start.
func (b *Bus) noSnapshot(ctx context.Context) error {
	st, err := b.snaps.Status(ctx)
	if err != nil {
		return fmt.Errorf("cluster: snapshot bucket %s: %w", b.cfg.Bucket, err)
	}
	if st.Size() > 0 {
		return fmt.Errorf("%w: the bucket holds %d bytes but no readable snapshot", ErrCorruptSnapshot, st.Size())
	}
	return ErrNoSnapshot
}

// Join brings a new or restarted replica up: it restores the newest
// snapshot into a fresh indexer (from newIndexer) and follows the stream
// from there. When retention has dropped events after that snapshot, it
// says so (RetentionGaps), closes that indexer, and waits (up to wait) for
// a snapshot past the gap from the replicas writing them, then rebuilds
// from it; it never serves an index missing events. Without any snapshot,
// or with one past the stream's end (the stream was re-created since), it
// follows from the stream's start.
func (b *Bus) Join(ctx context.Context, newIndexer func() shardpool.Indexer, wait time.Duration) (*Replica, shardpool.Indexer, error) {
	deadline := time.Now().Add(wait)
	for {
		idx := newIndexer()
		from, err := b.Restore(ctx, idx)
		switch {
		case errors.Is(err, ErrSnapshotPastStream):
			// The stream was re-created since: the snapshot reflects events
			// it no longer has. Restore applied nothing; start clean.
			from = 0
		case err != nil && !errors.Is(err, ErrNoSnapshot):
			idx.Close()
			return nil, nil, err
		}
		r, err := b.Follow(ctx, idx, from)
		var gap *RetentionGapError
		switch {
		case err == nil:
			return r, idx, nil
		case !errors.As(err, &gap) || time.Now().After(deadline):
			idx.Close()
			return nil, nil, err
		}
		idx.Close()
		if !ctxwait.Sleep(ctx, 100*time.Millisecond) {
			return nil, nil, ctx.Err()
		}
	}
}
