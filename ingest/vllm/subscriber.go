package vllm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/kvradix/kvradix/internal/ctxwait"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// Endpoint is one engine (one data-parallel rank) to subscribe to.
type Endpoint struct {
	Worker  kvevent.WorkerID // the worker its events belong to
	Address string           // its PUB endpoint, e.g. "tcp://10.0.0.5:5557"
	// Listen binds Address instead of dialling it, for engines whose
	// endpoint makes them connect (vLLM connects unless the endpoint has
	// "*" or "::", or is ipc or inproc).
	Listen bool
	Replay string // its replay (ROUTER) endpoint; "" for none
	Topic  string // subscription prefix; "" for everything
	// ResumeAt, from a saved state, is the sequence of the engine's first
	// batch not yet applied (0: none applied, start fresh). The first live
	// message then repairs from ResumeAt; if the engine's ring no longer
	// holds that far back, the worker's blocks are cleared (stale, they
	// cannot be trusted) and counted (ResumesCleared).
	ResumeAt uint64
	// DPRank is the rank the engine was registered as: a batch whose
	// envelope names no rank is that rank's.
	DPRank kvevent.DPRank
	// Model and Tenant are the engine's, where known: its events naming
	// another are dropped and counted (Converter.Model, Tenant).
	Model, Tenant string
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	BlockSize   int           // the router's KV block size
	ReplayIdle  time.Duration // give up a replay after this long without a reply (2s)
	ReplayTotal time.Duration // give up a replay after this long in all (2m)
	// MaxMessageBytes refuses, before any allocation, a ZMTP frame larger
	// than this from any peer (live or replay, TCP): the connection is
	// dropped and counted (DefaultMaxMessageBytes).
	MaxMessageBytes int
	// MaxConns caps the connections a Listen endpoint holds at once; more
	// are closed as they come and counted (DefaultMaxConns; a Dial
	// endpoint has one). With it, what peers can make an endpoint hold in
	// memory is bounded, across all its connections: zmq4 allocates each
	// frame whole as its header is read and keeps up to 10 received
	// messages per socket, plus one per connection waiting to be queued and
	// one being read, so at most (10 + 2·MaxConns)·MaxMessageBytes +
	// MaxQueueBytes: 224 MiB for a Dial endpoint with the defaults, 320 MiB
	// for a Listen one (16 hostile connections announcing 60 MiB frames
	// reached 1.69 GB before the cap and the 16 MiB limit).
	MaxConns int
	// HandshakeTimeout bounds a TCP connection's ZMTP handshake, and each
	// dial (DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// MaxQueueBytes bounds, per endpoint, the bytes of messages received
	// and not yet applied; past it the endpoint stops reading and the
	// engine's socket pushes back (32 MiB; a message larger than the bound
	// is still taken, alone). The queue also holds at most 4,096 messages.
	// A gap is found when the batch after it leaves the queue, and repaired
	// only if the engine's replay ring still holds it: keep the queue, in
	// batches, well within the ring (vLLM's holds 10,000), or a subscriber
	// running behind loses what it could have repaired (counted).
	MaxQueueBytes int
	// MaxSeqJump is the furthest ahead of the expected sequence a live
	// message is believed without the engine's ring reaching it (10,000,
	// vLLM's default replay buffer).
	MaxSeqJump uint64
	// IdleReplay is how long an endpoint with a replay endpoint may go
	// without a message (live or replayed) before its engine's ring is asked
	// for what it published past the last batch applied (DefaultIdleReplay;
	// negative: never). PUB/SUB drops a batch lost on the wire, or sent
	// before the subscription reached the engine, without a trace: the gap
	// shows only with the engine's next batch, which an idle engine may not
	// send for long. The ring is asked once an idle stretch has lasted
	// IdleReplay, then after 2, 4, 8... times that, and only if it still
	// holds the last batch applied (else the engine may have restarted,
	// which its next live message shows).
	IdleReplay time.Duration
	// OnLoss, if set, hears every loss as it is found (from the endpoint's
	// goroutine).
	OnLoss func(Loss)
}

// DefaultIdleReplay is SubscriberConfig.IdleReplay's default.
const DefaultIdleReplay = 10 * time.Second

// Loss is a run of batches an engine published that never reached the
// index: the gap could not be replayed, or a batch could not be decoded.
type Loss struct {
	Worker      kvevent.WorkerID
	Address     string
	First, Last uint64 // sequence numbers, inclusive
	// Events, if not 0, is how many events of batch First did not
	// decode: the batch's other events were applied.
	Events int
	Reason string
}

func (l Loss) String() string {
	if l.Events > 0 {
		return fmt.Sprintf("worker %d (%s): batch %d: %d events lost, the others applied: %s", l.Worker, l.Address, l.First, l.Events, l.Reason)
	}
	return fmt.Sprintf("worker %d (%s): lost batches %d..%d: %s", l.Worker, l.Address, l.First, l.Last, l.Reason)
}

// SubscriberStats are a subscriber's counters, summed over endpoints.
type SubscriberStats struct {
	Batches      uint64 // batches applied (live or replayed)
	Replayed     uint64 // of which replayed
	BadFrames    uint64 // live messages not [topic, 8-byte seq, payload]
	DecodeErrors uint64 // payloads that did not decode (each also a Loss)
	Duplicates   uint64 // live batches seen twice, dropped
	Restarts     uint64 // sequence went backwards: worker cleared, resynced
	// SuspectSeqs counts live messages whose sequence the engine's replay
	// ring did not confirm (far ahead, or backwards): dropped, not believed.
	SuspectSeqs uint64
	// Disconnects counts receive errors (a peer gone); the endpoint keeps
	// receiving as its socket reconnects.
	Disconnects  uint64
	GapsFound    uint64
	GapsRepaired uint64 // gaps fully filled by replay
	GapsLost     uint64 // gaps not (fully) filled
	BatchesLost  uint64 // batches in those gaps, and undecodable ones
	ApplyErrors  uint64 // events the indexer refused (closed)
	// FramesRefused counts frames larger than MaxMessageBytes (their
	// connections dropped); HandshakeTimeouts, peers that did not complete
	// the handshake in time.
	FramesRefused, HandshakeTimeouts uint64
	// ConnsRefused counts connections a Listen endpoint closed past
	// MaxConns.
	ConnsRefused uint64
	// Dials counts connection attempts to dialled endpoints: after failed
	// ones they are spaced out, 50 ms doubling to 5 s.
	Dials uint64
	// ResumesCleared counts endpoints resumed from a saved state whose
	// engine no longer held what they missed: their blocks were cleared.
	ResumesCleared uint64
	Convert        ConvertStats
	RecentLosses   []Loss // the latest losses, at most 64
	EventsApplied  uint64 // router events handed to the indexer
}

// Subscriber receives engines' KV events over ZeroMQ, decodes and converts
// them, and applies them to an indexer, in order per engine. Per endpoint
// it tracks the sequence: a gap is filled from the engine's replay socket
// before newer batches apply; a sequence that goes backwards means the
// engine restarted, so that worker's rank is cleared and resynced; whatever
// cannot be repaired is counted and reported as a Loss, never hidden.
type Subscriber struct {
	idx         Sink
	cfg         SubscriberConfig
	ctx         context.Context
	cancel      context.CancelFunc
	eps         []*endpoint
	wg          sync.WaitGroup
	guard       *guard
	replayGuard *guard // replay dials: the handshake bounded by ReplayIdle too

	mu     sync.Mutex
	losses []Loss
	c      struct {
		batches, replayed, badFrames, decodeErrs, dups, restarts, suspect, disconnects atomic.Uint64
		gaps, repaired, lost, batchesLost, applyErrs, applied                          atomic.Uint64
		resumesCleared                                                                 atomic.Uint64
	}
}

type endpoint struct {
	cfg     Endpoint
	sub     zmq4.Socket
	conv    *Converter
	msgs    chan zmq4.Msg
	flushes chan chan struct{}
	holds   chan chan struct{} // Pause: stop until the channel closes
	stopped chan struct{}      // closed when the processing goroutine ends
	queue   byteBudget         // bytes in msgs

	// owned by the endpoint's processing goroutine
	expected uint64
	recent   [256]applied // the latest batches applied, by seq mod 256: duplicates are recognised
	holes    bool         // the current repair lost batches
	rank     kvevent.DPRank
	resuming bool        // ResumeAt was given and its stream not repaired from there yet
	caughtUp atomic.Bool // see catchUp
	idleRecv int64       // lastRecv at the last idle tick (see idle)
	idleTick int         // idle ticks since then

	ranksMu   sync.Mutex
	ranks     map[kvevent.DPRank]bool // the registered rank, and every rank its batches named
	scratch   []kvevent.RouterEvent
	peer      *peerState    // the guard's state of a dialled endpoint (nil: a Listen one)
	seenConns uint64        // peer.conns at the last message (the processing goroutine's)
	lastSeq   atomic.Uint64 // last sequence applied, plus one (0 = none)
	lastRecv  atomic.Int64  // when the last message came, live or replayed, Unix ns (0 = none)
	down      atomic.Bool   // the last receive failed: reconnecting
}

// Sink is where a Subscriber hands the events it receives: an indexer
// (any shardpool.Indexer), or whatever forwards them to one (a bus).
type Sink interface {
	// ApplyEvent takes an event; an error counts it as not applied.
	ApplyEvent(ev kvevent.RouterEvent) error
	// Flush returns once every event taken before it has been applied.
	Flush() (int, error)
}

var _ Sink = shardpool.Indexer(nil)

// NewSubscriber connects to every endpoint and starts receiving.
func NewSubscriber(idx Sink, cfg SubscriberConfig, eps ...Endpoint) (*Subscriber, error) {
	return NewSubscriberContext(context.Background(), idx, cfg, eps...)
}

// NewSubscriberContext is NewSubscriber whose first dials (each bounded by
// HandshakeTimeout) are abandoned when ctx ends; ctx does not outlive the
// call.
func NewSubscriberContext(ctx context.Context, idx Sink, cfg SubscriberConfig, eps ...Endpoint) (*Subscriber, error) {
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("vllm: subscriber: block size %d, want > 0", cfg.BlockSize)
	}
	if cfg.ReplayIdle <= 0 {
		cfg.ReplayIdle = 2 * time.Second
	}
	if cfg.ReplayTotal <= 0 {
		cfg.ReplayTotal = 2 * time.Minute
	}
	if cfg.IdleReplay == 0 {
		cfg.IdleReplay = DefaultIdleReplay
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxSeqJump == 0 {
		cfg.MaxSeqJump = 10000
	}
	if cfg.MaxQueueBytes <= 0 {
		cfg.MaxQueueBytes = 32 << 20
	}
	g, err := newGuard(cfg.MaxMessageBytes, cfg.HandshakeTimeout, cfg.MaxConns)
	if err != nil {
		return nil, err
	}
	// A replay is given up after ReplayIdle without a reply; its dial and
	// handshake must not wait longer (a silent replay address held each
	// gap up for the whole handshake timeout).
	rg, err := newGuard(cfg.MaxMessageBytes, min(cfg.HandshakeTimeout, cfg.ReplayIdle), cfg.MaxConns)
	if err != nil {
		return nil, err
	}
	dialCtx := ctx
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{idx: idx, cfg: cfg, ctx: ctx, cancel: cancel, guard: g, replayGuard: rg}
	for _, ep := range eps {
		e := &endpoint{cfg: ep, conv: &Converter{Worker: ep.Worker, BlockSize: cfg.BlockSize, Rank: ep.DPRank, Model: ep.Model, Tenant: ep.Tenant}, rank: ep.DPRank, ranks: map[kvevent.DPRank]bool{ep.DPRank: true}, msgs: make(chan zmq4.Msg, 1<<12), flushes: make(chan chan struct{}), holds: make(chan chan struct{}), stopped: make(chan struct{})}
		if ep.ResumeAt > 0 {
			e.expected, e.resuming = ep.ResumeAt, true
			e.lastSeq.Store(ep.ResumeAt)
		}
		// Reconnects retry for as long as the subscriber lives (an engine
		// restarting takes its time: with a bounded count, one away for
		// longer than HandshakeTimeout was never heard from again); the
		// first dial is bounded by HandshakeTimeout.
		e.sub = zmq4.NewSub(ctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerTimeout(cfg.HandshakeTimeout),
			zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
		if ep.Listen {
			err = e.sub.Listen(g.endpoint(ep.Address))
		} else {
			e.peer = g.peer(peerAddr(ep.Address))
			err = dialWithin(dialCtx, e.sub, g.endpoint(ep.Address), cfg.HandshakeTimeout, g.close)
		}
		if err == nil {
			err = e.sub.SetOption(zmq4.OptionSubscribe, ep.Topic)
		}
		if err != nil {
			closeReceiver(e.sub)
			s.Close()
			return nil, fmt.Errorf("vllm: subscriber: worker %d at %s: %w", ep.Worker, ep.Address, err)
		}
		s.eps = append(s.eps, e)
		s.wg.Add(2)
		go s.receive(e)
		go s.process(e)
	}
	return s, nil
}

// dials sums the dials to every dialled endpoint.
func (s *Subscriber) dials() uint64 {
	n := uint64(0)
	for _, e := range s.eps {
		if e.peer != nil {
			n += e.peer.dials.Load()
		}
	}
	return n
}

// peerAddr is the address the guard's transport is given for an
// endpoint: tcp://host:port is host:port, ipc://path is path.
func peerAddr(ep string) string {
	_, addr, _ := strings.Cut(ep, "://")
	return addr
}

// dialWithin dials addr, retrying until d has passed or ctx ends; then it
// closes the socket, which ends the retries, and the connections (abort),
// which ends a handshake in progress, and fails.
func dialWithin(ctx context.Context, sub zmq4.Socket, addr string, d time.Duration, abort func()) error {
	done := make(chan error, 1)
	go func() { done <- sub.Dial(addr) }()
	t := time.NewTimer(d)
	defer t.Stop()
	var err error
	select {
	case err := <-done:
		return err
	case <-t.C:
		err = fmt.Errorf("no connection within %v", d)
	case <-ctx.Done():
		err = fmt.Errorf("dial abandoned: %w", context.Cause(ctx))
	}
	sub.Close()
	abort()
	<-done
	return err
}

// receive moves messages from the socket to the endpoint's queue. A
// receive error (the peer went away) is counted and waited out with
// backoff, the socket reconnecting underneath; whatever the peer's next
// life sends is resynced by handle (as a restart, or a gap).
func (s *Subscriber) receive(e *endpoint) {
	defer s.wg.Done()
	defer close(e.msgs)
	const first, most = 10 * time.Millisecond, 2 * time.Second
	backoff := first
	for {
		msg, err := e.sub.Recv()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.c.disconnects.Add(1)
			e.down.Store(true)
			if !ctxwait.Sleep(s.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, most)
			continue
		}
		backoff = first
		e.down.Store(false)
		e.lastRecv.Store(time.Now().UnixNano())
		if !e.queue.take(s.ctx, msgBytes(msg), s.cfg.MaxQueueBytes) {
			return
		}
		select {
		case e.msgs <- msg:
		case <-s.ctx.Done():
			return
		}
	}
}

func msgBytes(m zmq4.Msg) int {
	n := 0
	for _, f := range m.Frames {
		n += len(f)
	}
	return n
}

// byteBudget bounds the bytes queued between an endpoint's goroutines.
type byteBudget struct {
	mu    sync.Mutex
	cond  *sync.Cond
	bytes int
}

// take waits until n more bytes fit under limit (or nothing is queued), or
// ctx ends (false).
func (b *byteBudget) take(ctx context.Context, n, limit int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cond == nil {
		b.cond = sync.NewCond(&b.mu)
	}
	for b.bytes > 0 && b.bytes+n > limit {
		if ctx.Err() != nil {
			return false
		}
		b.cond.Wait()
	}
	b.bytes += n
	return ctx.Err() == nil
}

// give returns n bytes.
func (b *byteBudget) give(n int) {
	b.mu.Lock()
	b.bytes -= n
	b.mu.Unlock()
	b.wake()
}

// wake wakes a taker (to re-check its context, or the budget).
func (b *byteBudget) wake() {
	b.mu.Lock()
	if b.cond != nil {
		b.cond.Broadcast()
	}
	b.mu.Unlock()
}

func (s *Subscriber) process(e *endpoint) {
	defer s.wg.Done()
	defer close(e.stopped)
	s.catchUp(e)
	var idle <-chan time.Time
	if e.cfg.Replay != "" && s.cfg.IdleReplay > 0 {
		t := time.NewTicker(s.cfg.IdleReplay)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case msg, ok := <-e.msgs:
			if !ok {
				return
			}
			e.queue.give(msgBytes(msg))
			s.handle(e, msg)
		case <-idle:
			s.idle(e)
		case done := <-e.flushes:
			for drained := false; !drained; {
				select {
				case msg, ok := <-e.msgs:
					if !ok {
						drained = true
						break
					}
					e.queue.give(msgBytes(msg))
					s.handle(e, msg)
				default:
					drained = true
				}
			}
			close(done)
		case release := <-e.holds:
			select {
			case <-release:
			case <-s.ctx.Done():
			}
		}
	}
}

// catchUp, for an endpoint with a replay endpoint, replays what the engine
// published before the subscription (since ResumeAt, resumed from a saved
// position; else from its first batch), before any live message: the
// index catches up without waiting for the engine's next batch, which an
// idle engine may not send for long, and PUB/SUB drops what is published
// before a subscriber joins. The endpoint is then caught up (CaughtUp);
// one with no ring to ask is at once (a ring that cannot be reached now is
// asked again on the first live message). What the engine publishes
// between the replay's end and the subscription's start (nothing tells
// when a subscription has reached the publisher) is repaired with its
// next batch or, an idle engine's, when the ring is asked again after
// IdleReplay (see idle).
func (s *Subscriber) catchUp(e *endpoint) {
	defer e.caughtUp.Store(true)
	if e.cfg.Replay != "" && s.askRing(e) {
		s.resumed(e)
	}
}

// idle, at each tick of IdleReplay, asks the engine's ring for what it
// published past the last batch applied if no message (live or
// replayed) came since the last tick: at the first such tick of an idle
// stretch, then at the 2nd, 4th, 8th... (see SubscriberConfig.IdleReplay).
func (s *Subscriber) idle(e *endpoint) {
	if recv := e.lastRecv.Load(); recv != e.idleRecv {
		e.idleRecv, e.idleTick = recv, 0
		return
	}
	e.idleTick++
	if e.idleTick&(e.idleTick-1) != 0 {
		return
	}
	// The ring must hold the last batch applied, the same, or this may
	// be another life of the engine (a restart while the subscriber was
	// reconnecting): its next live message decides (see checkReconnect).
	if e.expected > 0 {
		last := e.recent[(e.expected-1)%uint64(len(e.recent))]
		if last.set && last.seq == e.expected-1 && !s.holds(e, last.seq, last.hash) {
			return
		}
	}
	if s.askRing(e) {
		s.resumed(e)
	}
}

// askRing replays what the engine's ring holds past the last batch
// applied, counting it a gap repaired (lost, where the ring no longer
// reaches back to it): whether it found anything. An unreachable ring
// finds nothing.
func (s *Subscriber) askRing(e *endpoint) bool {
	e.holes = false
	from := e.expected
	s.replay(e, from, math.MaxUint64)
	if e.expected == from && !e.holes {
		return false
	}
	s.c.gaps.Add(1)
	if e.holes {
		s.c.lost.Add(1)
	} else {
		s.c.repaired.Add(1)
	}
	return true
}

// resumed ends an endpoint's resumption from its saved position, once its
// stream has been repaired from there: if the repair lost batches, what
// the saved state held of the engine is stale past repair, and is
// forgotten rather than kept.
func (s *Subscriber) resumed(e *endpoint) {
	if !e.resuming {
		return
	}
	e.resuming = false
	if e.holes {
		s.c.resumesCleared.Add(1)
		s.clear(e)
	}
}

// clear drops what the index and the converter's copy counts hold of the
// endpoint's rank.
func (s *Subscriber) clear(e *endpoint) {
	e.conv.Forget(e.rank)
	s.apply(e, []kvevent.RouterEvent{{WorkerID: e.cfg.Worker, Event: kvevent.Event{DPRank: e.rank, Data: kvevent.Cleared{}}}})
}

// CaughtUp reports whether every endpoint has replayed what its engine
// published before the subscription (see catchUp).
func (s *Subscriber) CaughtUp() bool {
	for _, e := range s.eps {
		if !e.caughtUp.Load() {
			return false
		}
	}
	return true
}

// Pause stops applying, between two messages of every endpoint (a gap
// being repaired is repaired first), until resume is called: the
// subscriber's positions (Received) then stand for exactly the batches it
// handed to the indexer, so that the indexer, once flushed, and the
// positions are a consistent cut to save. Messages go on being received
// and queued, within MaxQueueBytes, meanwhile. If ctx ends before every
// endpoint has stopped, nothing stays paused and ctx's error is returned.
// Call resume exactly once; Close also ends a pause.
func (s *Subscriber) Pause(ctx context.Context) (resume func(), err error) {
	release := make(chan struct{})
	resume = sync.OnceFunc(func() { close(release) })
	for _, e := range s.eps {
		select {
		case e.holds <- release: // taken between two messages
		case <-e.stopped: // its socket ended: it applies nothing more
		case <-s.ctx.Done():
			resume()
			return nil, ErrClosed
		case <-ctx.Done():
			resume()
			return nil, ctx.Err()
		}
	}
	return resume, nil
}

// handle applies one live message, repairing gaps first. A sequence far
// ahead of the expected one, or behind it, is not believed on its own: the
// engine's replay ring must hold it (see suspicious).
func (s *Subscriber) handle(e *endpoint, msg zmq4.Msg) {
	f := msg.Frames
	if len(f) != 3 || len(f[1]) != 8 {
		s.c.badFrames.Add(1)
		return
	}
	seq, payload := binary.BigEndian.Uint64(f[1]), f[2]
	if seq != EndOfReplay {
		s.checkReconnect(e)
	}
	switch {
	case seq == EndOfReplay: // never a batch; seq+1 would wrap
		s.c.badFrames.Add(1)
		return
	case seq < e.expected:
		if r := e.recent[seq%uint64(len(e.recent))]; r.set && r.seq == seq && r.hash == xxh3.Hash(payload) {
			s.c.dups.Add(1) // applied already (live before, or by a replay)
			return
		}
		if s.suspicious(e, seq, payload) {
			return
		}
		// The engine restarted: what we hold of it is stale.
		s.restarted(e)
	case seq-e.expected > s.cfg.MaxSeqJump:
		// Further ahead than the engine's ring could hold: replay what it
		// has; believe the message only if the ring reaches it. A message
		// the ring does not reach is forged or stale, and no gap: what the
		// replay applied meanwhile would have come live. Only batches the
		// ring no longer holds are a gap, and lost.
		e.holes = false
		next, _, reached := s.replay(e, e.expected, seq)
		if !reached {
			s.c.suspect.Add(1)
			if e.holes {
				s.c.gaps.Add(1)
				s.c.lost.Add(1)
			}
			return
		}
		s.c.gaps.Add(1)
		if next < seq {
			s.lose(e, next, seq-1, "older than the engine's replay buffer")
			e.holes = true
		}
		if e.holes {
			s.c.lost.Add(1)
		} else {
			s.c.repaired.Add(1)
		}
	}
	if seq > e.expected {
		s.repair(e, e.expected, seq)
	}
	s.resumed(e)
	s.applyBatch(e, seq, payload)
	s.c.batches.Add(1)
}

// checkReconnect, on the first message of a new connection to the engine,
// asks its replay ring whether it still holds the last batch applied from
// it: an engine that restarted while it was away, and published past the
// sequence expected before the subscriber was back (redials back off),
// would otherwise look like the same life with a gap, and its old blocks
// would stay. Without a replay endpoint nothing can be checked.
func (s *Subscriber) checkReconnect(e *endpoint) {
	if e.peer == nil {
		return
	}
	conns := e.peer.conns.Load()
	if conns == e.seenConns {
		return
	}
	first := e.seenConns == 0
	e.seenConns = conns
	if first || e.cfg.Replay == "" || e.expected == 0 {
		return
	}
	last := e.recent[(e.expected-1)%uint64(len(e.recent))]
	if !last.set || last.seq != e.expected-1 || s.holds(e, last.seq, last.hash) {
		return
	}
	s.restarted(e)
}

// restarted forgets what the engine's previous life stored: its blocks are
// cleared and its stream starts again from 0. Received starts again before
// the restart is counted, so that a reader who sees the count never sees
// the old life's sequence.
func (s *Subscriber) restarted(e *endpoint) {
	e.lastSeq.Store(0)
	s.c.restarts.Add(1)
	s.clear(e)
	e.expected = 0
}

// suspicious reports, and counts, a message going backwards that is not
// the engine's new life. The engine restarted only if its ring holds the
// message and no longer holds the last batch applied from it; a message the
// ring holds beside that batch is a late duplicate (a reconnect can deliver
// the old connection's last messages after the new one's), and one the
// ring does not hold at all is stale or forged. Without a replay endpoint
// nothing can be checked: a restart is believed.
func (s *Subscriber) suspicious(e *endpoint, seq uint64, payload []byte) bool {
	if e.cfg.Replay == "" {
		return false
	}
	last := e.recent[(e.expected-1)%uint64(len(e.recent))]
	switch {
	case !s.holds(e, seq, xxh3.Hash(payload)):
		s.c.suspect.Add(1)
	case last.set && last.seq == e.expected-1 && s.holds(e, last.seq, last.hash):
		s.c.dups.Add(1)
	default:
		return false
	}
	return true
}

// repair fills [from, to) from the engine's replay socket.
func (s *Subscriber) repair(e *endpoint, from, to uint64) {
	s.c.gaps.Add(1)
	e.holes = false
	next, reason, _ := s.replay(e, from, to)
	if next < to {
		s.lose(e, next, to-1, reason)
		e.holes = true
	}
	if e.holes {
		s.c.lost.Add(1)
	} else {
		s.c.repaired.Add(1)
	}
}

func (s *Subscriber) lose(e *endpoint, first, last uint64, reason string) {
	n := last - first + 1
	if n == 0 {
		n = ^uint64(0) // the whole range of uint64
	}
	addSat(&s.c.batchesLost, n)
	s.report(Loss{Worker: e.cfg.Worker, Address: e.cfg.Address, First: first, Last: last, Reason: reason})
}

// report keeps a loss among the recent ones and tells OnLoss.
func (s *Subscriber) report(l Loss) {
	s.mu.Lock()
	if len(s.losses) == 64 {
		s.losses = s.losses[1:]
	}
	s.losses = append(s.losses, l)
	s.mu.Unlock()
	if s.cfg.OnLoss != nil {
		s.cfg.OnLoss(l)
	}
}

// badEvents counts the events of b that did not decode.
func badEvents(b *Batch) int {
	n := 0
	for i := range b.Events {
		if b.Events[i].Err != nil {
			n++
		}
	}
	return n
}

// applied is a batch applied: its sequence and payload hash.
type applied struct {
	seq, hash uint64
	set       bool
}

// replayed is one reply of a replay: a batch, or the end (end set).
type replayed struct {
	seq     uint64
	payload []byte
	end     bool
}

// replayStream asks the engine for its batches from `from` and streams the
// replies, parsed, until the end marker or stop; "" and a reason if it
// could not ask.
func (s *Subscriber) replayStream(ctx context.Context, e *endpoint, from uint64) (<-chan replayed, string) {
	if e.cfg.Replay == "" {
		return nil, "no replay endpoint"
	}
	dealer := zmq4.NewDealer(ctx, zmq4.WithTimeout(s.cfg.ReplayIdle), zmq4.WithDialerTimeout(s.replayGuard.handshake), zmq4.WithDialerMaxRetries(0))
	if err := dealer.Dial(s.replayGuard.endpoint(e.cfg.Replay)); err != nil {
		closeReceiver(dealer)
		return nil, "replay dial: " + err.Error()
	}
	if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, seqFrame(from))); err != nil {
		closeReceiver(dealer)
		return nil, "replay request: " + err.Error()
	}
	replies := make(chan replayed)
	go func() {
		defer close(replies)
		defer closeReceiver(dealer)
		for {
			msg, err := dealer.Recv()
			if err != nil {
				return
			}
			f := msg.Frames
			if len(f) > 0 && len(f[0]) == 0 {
				f = f[1:] // the DEALER sees the ROUTER's empty delimiter
			}
			if len(f) == 3 {
				f = f[1:] // [topic, seq, payload] since vLLM #45177
			}
			if len(f) != 2 || len(f[0]) != 8 {
				continue
			}
			r := replayed{seq: binary.BigEndian.Uint64(f[0]), payload: f[1]}
			r.end = r.seq == EndOfReplay || len(r.payload) == 0
			select {
			case replies <- r:
			case <-ctx.Done():
				return
			}
			if r.end {
				return
			}
		}
	}()
	return replies, ""
}

// replay asks the engine for batches from `from` and applies those below
// `to` in order. It returns the first sequence it could not apply and why,
// and whether the engine's ring reached `to` (a batch at or past it).
func (s *Subscriber) replay(e *endpoint, from, to uint64) (uint64, string, bool) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReplayTotal)
	defer cancel()
	replies, why := s.replayStream(ctx, e, from)
	if replies == nil {
		return from, why, false
	}
	next := from
	idle := time.NewTimer(s.cfg.ReplayIdle)
	defer idle.Stop()
	for {
		select {
		case r, ok := <-replies:
			switch {
			case !ok:
				return next, "replay connection ended", false
			case r.end && next < to:
				return next, "older than the engine's replay buffer", false
			case r.end:
				return next, "", false
			case r.seq < next:
				continue // already applied
			case r.seq >= to:
				return next, "", true // the rest arrives live
			case r.seq > next:
				s.lose(e, next, r.seq-1, "older than the engine's replay buffer")
				e.holes = true
			}
			s.applyBatch(e, r.seq, r.payload)
			e.lastRecv.Store(time.Now().UnixNano())
			s.c.batches.Add(1)
			s.c.replayed.Add(1)
			next = r.seq + 1
			idle.Reset(s.cfg.ReplayIdle)
		case <-idle.C:
			return next, "replay timed out", false
		case <-ctx.Done():
			return next, "replay cancelled or over its total time", false
		}
	}
}

// holds reports whether the engine's replay ring holds batch seq with a
// payload of this hash: the proof that a message is the engine's own.
func (s *Subscriber) holds(e *endpoint, seq uint64, hash uint64) bool {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReplayIdle)
	defer cancel()
	replies, _ := s.replayStream(ctx, e, seq)
	if replies == nil {
		return false
	}
	select {
	case r, ok := <-replies:
		return ok && !r.end && r.seq == seq && xxh3.Hash(r.payload) == hash
	case <-ctx.Done():
		return false
	}
}

// applyBatch decodes, converts and applies one batch, and advances the
// expected sequence past it.
func (s *Subscriber) applyBatch(e *endpoint, seq uint64, payload []byte) {
	e.expected = seq + 1
	e.recent[seq%uint64(len(e.recent))] = applied{seq: seq, hash: xxh3.Hash(payload), set: true}
	e.lastSeq.Store(seq + 1)
	b, err := DecodeBatch(payload)
	switch {
	case errors.Is(err, ErrBadEvents):
		// The batch stands; the converter counts its bad events.
		s.report(Loss{Worker: e.cfg.Worker, Address: e.cfg.Address, First: seq, Last: seq, Events: badEvents(&b), Reason: err.Error()})
	case err != nil:
		s.c.decodeErrs.Add(1)
		s.lose(e, seq, seq, err.Error())
		return
	}
	if b.DPRank != nil && *b.DPRank >= 0 {
		e.rank = kvevent.DPRank(*b.DPRank)
		if !e.ranks[e.rank] {
			e.ranksMu.Lock()
			e.ranks[e.rank] = true
			e.ranksMu.Unlock()
		}
	}
	e.scratch = e.conv.Convert(e.scratch[:0], &b)
	s.apply(e, e.scratch)
}

func (s *Subscriber) apply(e *endpoint, evs []kvevent.RouterEvent) {
	for _, ev := range evs {
		if err := s.idx.ApplyEvent(ev); err != nil {
			s.c.applyErrs.Add(1)
			continue
		}
		s.c.applied.Add(1)
	}
	clear(e.scratch)
}

// Received returns, per endpoint (in NewSubscriber's order), how many
// batches were applied up to the latest sequence: the latest sequence plus
// one, or 0 before the first. An engine's restart resets it to 0 before
// Stats().Restarts counts the restart, so a caller waiting for an engine's
// sequence after restarting it waits for the count first, then for this.
func (s *Subscriber) Received() []uint64 {
	out := make([]uint64, len(s.eps))
	for i, e := range s.eps {
		out[i] = e.lastSeq.Load()
	}
	return out
}

// Ranks returns every rank the endpoints' events were applied as: the
// registered ones, and every rank their batches named. Unregistering an
// engine removes them all.
func (s *Subscriber) Ranks() []kvevent.DPRank {
	var out []kvevent.DPRank
	for _, e := range s.eps {
		e.ranksMu.Lock()
		for r := range e.ranks {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
		e.ranksMu.Unlock()
	}
	slices.Sort(out)
	return out
}

// EndpointState is where an endpoint's connection stands.
type EndpointState struct {
	Down        bool      // its last receive failed: reconnecting
	LastMessage time.Time // when its last message came, live or replayed (zero: none yet)
}

// States returns, per endpoint (in NewSubscriber's order), where its
// connection stands.
func (s *Subscriber) States() []EndpointState {
	out := make([]EndpointState, len(s.eps))
	for i, e := range s.eps {
		out[i].Down = e.down.Load() || (e.peer != nil && e.peer.down())
		if ns := e.lastRecv.Load(); ns != 0 {
			out[i].LastMessage = time.Unix(0, ns)
		}
	}
	return out
}

// Stats returns the counters.
func (s *Subscriber) Stats() SubscriberStats {
	st := SubscriberStats{
		Batches: s.c.batches.Load(), Replayed: s.c.replayed.Load(), BadFrames: s.c.badFrames.Load(),
		DecodeErrors: s.c.decodeErrs.Load(), Duplicates: s.c.dups.Load(), Restarts: s.c.restarts.Load(), SuspectSeqs: s.c.suspect.Load(), Disconnects: s.c.disconnects.Load(),
		GapsFound: s.c.gaps.Load(), GapsRepaired: s.c.repaired.Load(), GapsLost: s.c.lost.Load(),
		FramesRefused: s.guard.refused.Load() + s.replayGuard.refused.Load(), HandshakeTimeouts: s.guard.timeouts.Load() + s.replayGuard.timeouts.Load(),
		ConnsRefused: s.guard.turnedAway.Load(), ResumesCleared: s.c.resumesCleared.Load(), Dials: s.dials(),
		BatchesLost: s.c.batchesLost.Load(), ApplyErrors: s.c.applyErrs.Load(), EventsApplied: s.c.applied.Load(),
	}
	for _, e := range s.eps {
		st.Convert.add(e.conv.Stats())
	}
	s.mu.Lock()
	st.RecentLosses = append([]Loss(nil), s.losses...)
	s.mu.Unlock()
	return st
}

// ErrClosed is returned by calls after Close.
var ErrClosed = errors.New("vllm: subscriber closed")

// Flush returns once every message received so far has been applied to the
// indexer, and the indexer has applied it.
func (s *Subscriber) Flush() error {
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	for _, e := range s.eps {
		done := make(chan struct{})
		select {
		case e.flushes <- done:
			<-done
		case <-e.stopped: // its socket ended: everything it received is applied
		case <-s.ctx.Done():
			return ErrClosed
		}
	}
	_, err := s.idx.Flush()
	return err
}

// Close stops receiving, applies what was already received, and waits for
// the goroutines. The indexer stays open: its owner closes it.
func (s *Subscriber) Close() error {
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	s.cancel()
	s.guard.close() // unblocks reads and handshakes, whatever the peers do
	s.replayGuard.close()
	for _, e := range s.eps {
		e.queue.wake() // a receiver waiting for room sees the cancel
	}
	var err error
	for _, e := range s.eps {
		// The guard closed the connections first: a socket finding its own
		// closed is the clean case, not an error.
		if cerr := closeReceiver(e.sub); !errors.Is(cerr, net.ErrClosed) {
			err = errors.Join(err, cerr)
		}
	}
	s.wg.Wait()
	return err
}

// addSat adds n to c, stopping at the largest uint64 instead of wrapping.
func addSat(c *atomic.Uint64, n uint64) {
	for {
		old := c.Load()
		v := old + n
		if v < old {
			v = ^uint64(0)
		}
		if c.CompareAndSwap(old, v) {
			return
		}
	}
}
