package vllm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// EndOfReplay is the sequence number of the replay end marker.
const EndOfReplay = ^uint64(0)

// Framing is how replayed batches are framed.
type Framing uint8

const (
	// FramingTopic is [topic, seq, payload], as vLLM sends since #45177.
	FramingTopic Framing = iota
	// FramingLegacy is [seq, payload], as vLLM sent before #45177.
	FramingLegacy
)

// PublisherConfig configures a vLLM-compatible publisher.
type PublisherConfig struct {
	Endpoint       string   // the PUB socket binds here, e.g. "tcp://127.0.0.1:0"
	ReplayEndpoint string   // the ROUTER replay socket binds here; "" for none
	Topic          string   // the first frame of every live message
	Encoding       Encoding // of the events
	Framing        Framing  // of replayed batches
	BufferSteps    int      // batches kept for replay (vLLM's buffer_steps, 10000)
	DPRank         *int     // the envelope's data_parallel_rank
	// SlowAfter is how long one write to a subscriber may block before the
	// subscriber is cut (DefaultSlowAfter): see Publisher.SlowSubscribers.
	SlowAfter time.Duration
}

// Publisher publishes KV event batches as a vLLM engine does: three-frame
// live messages [topic, seq (8 bytes big-endian), payload] on a PUB socket,
// and a ROUTER replay socket answering a start sequence with every buffered
// batch from it and an end marker. It is safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	cutter *slowCutter
	pub    zmq4.Socket
	router zmq4.Socket
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	seq    uint64
	ring   []ringEntry // the last BufferSteps batches, a circle: ring[head] is the oldest once full
	head   int
	buf    []byte // encoding scratch
	// DropLive, when set, is asked before each live send; returning true
	// drops the message (it stays in the replay ring), as a PUB socket does
	// when a subscriber's queue is full. For tests and load generation.
	DropLive func(seq uint64) bool
	// ReplayDelay, when set, delays every replay answer by its value: a
	// stalled replay socket, for fault injection.
	ReplayDelay atomic.Int64 // nanoseconds
	ctx         context.Context
	replays     atomic.Uint64 // replay requests answered
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

// NewPublisher binds the sockets.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = 10000
	}
	if cfg.SlowAfter <= 0 {
		cfg.SlowAfter = DefaultSlowAfter
	}
	cutter, err := newSlowCutter(cfg.SlowAfter)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, cutter: cutter, cancel: cancel, pub: zmq4.NewPub(ctx), ctx: ctx}
	if err := p.pub.Listen(cutter.endpoint(cfg.Endpoint)); err != nil {
		cancel()
		p.pub.Close()
		return nil, fmt.Errorf("vllm: publisher: listen %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithTimeout(2*time.Second))
		if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
			cancel()
			p.pub.Close()
			closeReceiver(p.router)
			return nil, fmt.Errorf("vllm: publisher: replay listen %s: %w", cfg.ReplayEndpoint, err)
		}
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// SlowSubscribers counts the subscribers cut for not reading: a write to
// them blocked longer than SlowAfter. A subscriber that stops reading
// would otherwise hold every other back while the send queue grows.
func (p *Publisher) SlowSubscribers() uint64 { return p.cutter.cut.Load() }

// Addr returns the live endpoint as subscribers dial it.
func (p *Publisher) Addr() string { return "tcp://" + p.pub.Addr().String() }

// ReplayAddr returns the replay endpoint, or "" if there is none.
func (p *Publisher) ReplayAddr() string {
	if p.router == nil {
		return ""
	}
	return "tcp://" + p.router.Addr().String()
}

// Publish sends one batch of events and returns its sequence number.
func (p *Publisher) Publish(events []Event) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrPublisherClosed
	}
	b := Batch{TS: float64(time.Now().UnixNano()) / 1e9, DPRank: p.cfg.DPRank, Events: events}
	// Encode into a reused buffer and keep an exact copy: an appended
	// buffer's spare capacity (up to half of it) would sit in the ring.
	p.buf = AppendBatch(p.buf[:0], &b, p.cfg.Encoding)
	return p.publish(bytes.Clone(p.buf))
}

// PublishPayload publishes an already encoded batch (AppendBatch in the
// publisher's encoding): a captured engine's traffic, or a harness that
// encodes ahead.
func (p *Publisher) PublishPayload(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrPublisherClosed
	}
	return p.publish(payload)
}

// publish numbers, records and sends a payload; p.mu is held.
func (p *Publisher) publish(payload []byte) (uint64, error) {
	seq := p.seq
	p.seq++
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, ringEntry{seq, payload})
	} else {
		p.ring[p.head] = ringEntry{seq, payload}
		p.head = (p.head + 1) % len(p.ring)
	}
	if p.DropLive != nil && p.DropLive(seq) {
		return seq, nil
	}
	msg := zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqFrame(seq), payload)
	if err := p.pub.Send(msg); err != nil {
		return seq, fmt.Errorf("vllm: publish %d: %w", seq, err)
	}
	return seq, nil
}

// PublishAt sends a batch under the given sequence number without
// recording it in the replay ring or moving the sequence: a stray or forged
// message, for fault injection.
func (p *Publisher) PublishAt(seq uint64, events []Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrPublisherClosed
	}
	b := Batch{TS: float64(time.Now().UnixNano()) / 1e9, DPRank: p.cfg.DPRank, Events: events}
	return p.pub.Send(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqFrame(seq), AppendBatch(nil, &b, p.cfg.Encoding)))
}

// Rebind closes the live socket and binds it again on the same address: its
// subscribers lose the connection (and whatever is published meanwhile),
// reconnect, and repair from the ring; the sequence and the ring go on. A
// disconnect, for fault injection.
func (p *Publisher) Rebind() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrPublisherClosed
	}
	addr := p.Addr()
	p.pub.Close()
	p.pub = zmq4.NewPub(p.ctx)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := p.pub.Listen(p.cutter.endpoint(addr))
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vllm: publisher: rebind %s: %w", addr, err)
		}
	}
}

// Restart simulates the engine process restarting: sequence numbers start
// again at 0 and the replay ring is emptied.
func (p *Publisher) Restart() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq = 0
	p.ring, p.head = nil, 0
}

func seqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// ReplayRequests counts the replay requests answered (their end marker
// sent).
func (p *Publisher) ReplayRequests() uint64 { return p.replays.Load() }

// serveReplay answers replay requests: exactly [identity, "", start_seq].
func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			continue // vLLM logs and ignores anything else
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		if d := time.Duration(p.ReplayDelay.Load()); d > 0 {
			time.Sleep(d)
		}
		p.mu.Lock()
		var batch []ringEntry
		for k := range p.ring {
			e := p.ring[(p.head+k)%len(p.ring)]
			if e.seq >= start {
				batch = append(batch, e)
			}
		}
		p.mu.Unlock()
		for _, e := range batch {
			if p.reply(id, seqFrame(e.seq), e.payload) != nil {
				break
			}
		}
		_ = p.reply(id, seqFrame(EndOfReplay), nil)
		p.replays.Add(1)
	}
}

func (p *Publisher) reply(id, seq, payload []byte) error {
	frames := [][]byte{id, {}}
	if p.cfg.Framing == FramingTopic {
		frames = append(frames, []byte(p.cfg.Topic))
	}
	frames = append(frames, seq, payload)
	return p.router.Send(zmq4.NewMsgFrom(frames...))
}

// ErrPublisherClosed is returned by Publish after Close, and by a second
// Close.
var ErrPublisherClosed = errors.New("vllm: publisher closed")

// Close closes the sockets, waits for the replay server and lets go of the
// replay ring.
func (p *Publisher) Close() error {
	p.mu.Lock()
	closed := p.closed
	p.closed = true
	p.mu.Unlock()
	if closed {
		return ErrPublisherClosed
	}
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, closeReceiver(p.router))
	}
	p.wg.Wait()
	p.mu.Lock()
	p.ring, p.head = nil, 0 // the payloads can be large, and the Publisher may stay referenced
	p.mu.Unlock()
	return err
}
