package vllm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"

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
	// HandshakeTimeout bounds a TCP connection's ZMTP handshake, and each
	// dial (DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// OnLoss, if set, hears every loss as it is found (from the endpoint's
	// goroutine).
	OnLoss func(Loss)
}

// Loss is a run of batches an engine published that never reached the
// index: the gap could not be replayed, or a batch could not be decoded.
type Loss struct {
	Worker      kvevent.WorkerID
	Address     string
	First, Last uint64 // sequence numbers, inclusive
	Reason      string
}

func (l Loss) String() string {
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
	GapsFound    uint64
	GapsRepaired uint64 // gaps fully filled by replay
	GapsLost     uint64 // gaps not (fully) filled
	BatchesLost  uint64 // batches in those gaps, and undecodable ones
	ApplyErrors  uint64 // events the indexer refused (closed)
	// FramesRefused counts frames larger than MaxMessageBytes (their
	// connections dropped); HandshakeTimeouts, peers that did not complete
	// the handshake in time.
	FramesRefused, HandshakeTimeouts uint64
	Convert                          ConvertStats
	RecentLosses                     []Loss // the latest losses, at most 64
	EventsApplied                    uint64 // router events handed to the indexer
}

// Subscriber receives engines' KV events over ZeroMQ, decodes and converts
// them, and applies them to an indexer, in order per engine. Per endpoint
// it tracks the sequence: a gap is filled from the engine's replay socket
// before newer batches apply; a sequence that goes backwards means the
// engine restarted, so that worker's rank is cleared and resynced; whatever
// cannot be repaired is counted and reported as a Loss, never hidden.
type Subscriber struct {
	idx    shardpool.Indexer
	cfg    SubscriberConfig
	ctx    context.Context
	cancel context.CancelFunc
	eps    []*endpoint
	wg     sync.WaitGroup
	guard  *guard

	mu     sync.Mutex
	losses []Loss
	c      struct {
		batches, replayed, badFrames, decodeErrs, dups, restarts atomic.Uint64
		gaps, repaired, lost, batchesLost, applyErrs, applied    atomic.Uint64
	}
}

type endpoint struct {
	cfg     Endpoint
	sub     zmq4.Socket
	conv    *Converter
	msgs    chan zmq4.Msg
	flushes chan chan struct{}
	stopped chan struct{} // closed when the processing goroutine ends

	// owned by the endpoint's processing goroutine
	expected uint64
	lastHash uint64
	holes    bool // the current repair lost batches
	rank     kvevent.DPRank
	scratch  []kvevent.RouterEvent
	lastSeq  atomic.Uint64 // last sequence applied, plus one (0 = none)
}

// NewSubscriber connects to every endpoint and starts receiving.
func NewSubscriber(idx shardpool.Indexer, cfg SubscriberConfig, eps ...Endpoint) (*Subscriber, error) {
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("vllm: subscriber: block size %d, want > 0", cfg.BlockSize)
	}
	if cfg.ReplayIdle <= 0 {
		cfg.ReplayIdle = 2 * time.Second
	}
	if cfg.ReplayTotal <= 0 {
		cfg.ReplayTotal = 2 * time.Minute
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	g, err := newGuard(cfg.MaxMessageBytes, cfg.HandshakeTimeout)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{idx: idx, cfg: cfg, ctx: ctx, cancel: cancel, guard: g}
	for _, ep := range eps {
		e := &endpoint{cfg: ep, conv: NewConverter(ep.Worker, cfg.BlockSize), msgs: make(chan zmq4.Msg, 1<<12), flushes: make(chan chan struct{}), stopped: make(chan struct{})}
		e.sub = zmq4.NewSub(ctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerTimeout(cfg.HandshakeTimeout),
			zmq4.WithDialerMaxRetries(int(cfg.HandshakeTimeout/(50*time.Millisecond))), zmq4.WithAutomaticReconnect(true))
		if ep.Listen {
			err = e.sub.Listen(g.endpoint(ep.Address))
		} else {
			err = e.sub.Dial(g.endpoint(ep.Address))
		}
		if err == nil {
			err = e.sub.SetOption(zmq4.OptionSubscribe, ep.Topic)
		}
		if err != nil {
			e.sub.Close()
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

// receive moves messages from the socket to the endpoint's queue.
func (s *Subscriber) receive(e *endpoint) {
	defer s.wg.Done()
	defer close(e.msgs)
	for {
		msg, err := e.sub.Recv()
		if err != nil {
			return
		}
		select {
		case e.msgs <- msg:
		case <-s.ctx.Done():
			return
		}
	}
}

func (s *Subscriber) process(e *endpoint) {
	defer s.wg.Done()
	defer close(e.stopped)
	for {
		select {
		case msg, ok := <-e.msgs:
			if !ok {
				return
			}
			s.handle(e, msg)
		case done := <-e.flushes:
			for drained := false; !drained; {
				select {
				case msg, ok := <-e.msgs:
					if !ok {
						drained = true
						break
					}
					s.handle(e, msg)
				default:
					drained = true
				}
			}
			close(done)
		}
	}
}

// handle applies one live message, repairing gaps first.
func (s *Subscriber) handle(e *endpoint, msg zmq4.Msg) {
	f := msg.Frames
	if len(f) != 3 || len(f[1]) != 8 {
		s.c.badFrames.Add(1)
		return
	}
	seq, payload := binary.BigEndian.Uint64(f[1]), f[2]
	if seq < e.expected {
		if seq == e.expected-1 && xxh3.Hash(payload) == e.lastHash {
			s.c.dups.Add(1)
			return
		}
		// The engine restarted: what we hold of it is stale. Received
		// starts again before the restart is counted, so that a reader who
		// sees the count never sees the old life's sequence.
		e.lastSeq.Store(0)
		s.c.restarts.Add(1)
		s.apply(e, []kvevent.RouterEvent{{WorkerID: e.cfg.Worker, Event: kvevent.Event{DPRank: e.rank, Data: kvevent.Cleared{}}}})
		e.expected = 0
	}
	if seq > e.expected {
		s.repair(e, e.expected, seq)
	}
	s.applyBatch(e, seq, payload)
	s.c.batches.Add(1)
}

// repair fills [from, to) from the engine's replay socket.
func (s *Subscriber) repair(e *endpoint, from, to uint64) {
	s.c.gaps.Add(1)
	e.holes = false
	next, reason := s.replay(e, from, to)
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
	s.c.batchesLost.Add(last - first + 1)
	l := Loss{Worker: e.cfg.Worker, Address: e.cfg.Address, First: first, Last: last, Reason: reason}
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

// replay asks the engine for batches from `from` and applies those below
// `to` in order. It returns the first sequence it could not apply and why.
func (s *Subscriber) replay(e *endpoint, from, to uint64) (uint64, string) {
	if e.cfg.Replay == "" {
		return from, "no replay endpoint"
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReplayTotal)
	defer cancel()
	dealer := zmq4.NewDealer(ctx, zmq4.WithTimeout(s.cfg.ReplayIdle), zmq4.WithDialerTimeout(s.cfg.HandshakeTimeout), zmq4.WithDialerMaxRetries(0))
	defer dealer.Close()
	if err := dealer.Dial(s.guard.endpoint(e.cfg.Replay)); err != nil {
		return from, "replay dial: " + err.Error()
	}
	if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, seqFrame(from))); err != nil {
		return from, "replay request: " + err.Error()
	}
	replies := make(chan zmq4.Msg)
	go func() {
		defer close(replies)
		for {
			msg, err := dealer.Recv()
			if err != nil {
				return
			}
			select {
			case replies <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	next := from
	idle := time.NewTimer(s.cfg.ReplayIdle)
	defer idle.Stop()
	for {
		select {
		case msg, ok := <-replies:
			if !ok {
				return next, "replay connection ended"
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
			seq := binary.BigEndian.Uint64(f[0])
			if seq == EndOfReplay || len(f[1]) == 0 {
				if next < to {
					return next, "older than the engine's replay buffer"
				}
				return next, ""
			}
			switch {
			case seq < next:
				continue // already applied
			case seq >= to:
				cancel() // the rest arrives live
				return next, ""
			case seq > next:
				s.lose(e, next, seq-1, "older than the engine's replay buffer")
				e.holes = true
			}
			s.applyBatch(e, seq, f[1])
			s.c.batches.Add(1)
			s.c.replayed.Add(1)
			next = seq + 1
			idle.Reset(s.cfg.ReplayIdle)
		case <-idle.C:
			return next, "replay timed out"
		case <-ctx.Done():
			return next, "replay cancelled or over its total time"
		}
	}
}

// applyBatch decodes, converts and applies one batch, and advances the
// expected sequence past it.
func (s *Subscriber) applyBatch(e *endpoint, seq uint64, payload []byte) {
	e.expected = seq + 1
	e.lastHash = xxh3.Hash(payload)
	e.lastSeq.Store(seq + 1)
	b, err := DecodeBatch(payload)
	if err != nil {
		s.c.decodeErrs.Add(1)
		s.lose(e, seq, seq, err.Error())
		return
	}
	if b.DPRank != nil && *b.DPRank >= 0 {
		e.rank = kvevent.DPRank(*b.DPRank)
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

// Stats returns the counters.
func (s *Subscriber) Stats() SubscriberStats {
	st := SubscriberStats{
		Batches: s.c.batches.Load(), Replayed: s.c.replayed.Load(), BadFrames: s.c.badFrames.Load(),
		DecodeErrors: s.c.decodeErrs.Load(), Duplicates: s.c.dups.Load(), Restarts: s.c.restarts.Load(),
		GapsFound: s.c.gaps.Load(), GapsRepaired: s.c.repaired.Load(), GapsLost: s.c.lost.Load(),
		FramesRefused: s.guard.refused.Load(), HandshakeTimeouts: s.guard.timeouts.Load(),
		BatchesLost: s.c.batchesLost.Load(), ApplyErrors: s.c.applyErrs.Load(), EventsApplied: s.c.applied.Load(),
	}
	for _, e := range s.eps {
		c := e.conv.Stats()
		st.Convert.Stored += c.Stored
		st.Convert.Removed += c.Removed
		st.Convert.Cleared += c.Cleared
		st.Convert.BadBlockSize += c.BadBlockSize
		st.Convert.BadTokenCount += c.BadTokenCount
		st.Convert.OtherGroup += c.OtherGroup
		st.Convert.UnknownType += c.UnknownType
		st.Convert.BadRank += c.BadRank
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
	var err error
	for _, e := range s.eps {
		err = errors.Join(err, e.sub.Close())
	}
	s.wg.Wait()
	return err
}
