package vllm

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"

	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/holdings"
	"github.com/kvradix/kvradix/shardpool"
)

// hostilePeer is a raw TCP or unix-socket listener standing in for an
// engine: it runs behave on every connection it accepts.
type hostilePeer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

// transports are the ZeroMQ transports a peer can reach us by: tcp://,
// and ipc:// (a local peer is no more trusted than a remote one).
var transports = []string{"tcp", "ipc"}

func newHostilePeer(t *testing.T, transport string, behave func(c net.Conn)) *hostilePeer {
	t.Helper()
	var ln net.Listener
	var err error
	if transport == "ipc" {
		// Not t.TempDir: a unix socket's path must stay under ~100 bytes.
		dir, derr := os.MkdirTemp("", "kvr")
		if derr != nil {
			t.Fatal(derr)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		ln, err = net.Listen("unix", filepath.Join(dir, "peer.sock"))
	} else {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	p := &hostilePeer{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Go(func() { behave(c) })
		}
	})
	t.Cleanup(p.close)
	return p
}

func (p *hostilePeer) addr() string {
	if p.ln.Addr().Network() == "unix" {
		return "ipc://" + p.ln.Addr().String()
	}
	return "tcp://" + p.ln.Addr().String()
}

func (p *hostilePeer) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// greet writes a ZMTP 3.0 NULL greeting and a READY command for a PUB.
func greet(c net.Conn) error {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xFF, 0x7F, 3
	copy(g[12:], "NULL")
	body := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")
	_, err := c.Write(append(append(g, 0x04, byte(len(body))), body...))
	return err
}

// longFrame is the header of a frame claiming size bytes.
func longFrame(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | zLong}, size)
}

func newTestSubscriber(t *testing.T, cfg SubscriberConfig, eps ...Endpoint) (*Subscriber, *shardpool.Single, error) {
	t.Helper()
	idx := shardpool.NewSingle(bs)
	t.Cleanup(func() { idx.Close() })
	cfg.BlockSize = bs
	sub, err := NewSubscriber(idx, cfg, eps...)
	return sub, idx, err
}

// A peer whose frame header claims 2^62 bytes, after the handshake, is
// refused before any allocation: the connection drops, the frame is
// counted, the process lives, and the subscriber closes cleanly; over TCP
// and over a unix socket alike.
func TestOversizedFrameIsRefused(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			peer := newHostilePeer(t, tr, func(c net.Conn) {
				if greet(c) != nil {
					return
				}
				time.Sleep(50 * time.Millisecond) // let the subscriber's handshake finish
				c.Write(longFrame(0, 1<<62))
				io.Copy(io.Discard, c)
			})
			sub, _, err := newTestSubscriber(t, SubscriberConfig{}, Endpoint{Worker: 1, Address: peer.addr()})
			if err != nil {
				t.Fatal(err)
			}
			testwait.For(t, "the oversized frame to be refused", func() bool { return sub.Stats().FramesRefused >= 1 })
			if err := sub.Close(); err != nil && !strings.Contains(err.Error(), "closed") {
				t.Logf("close: %v", err)
			}
		})
	}
}

// The same claim inside the handshake (a command frame) fails the dial,
// not the process.
func TestOversizedHandshakeFrameIsRefused(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			peer := newHostilePeer(t, tr, func(c net.Conn) {
				g := make([]byte, 64)
				g[0], g[9], g[10] = 0xFF, 0x7F, 3
				copy(g[12:], "NULL")
				c.Write(append(g, longFrame(zCommand, 1<<62)...))
				io.Copy(io.Discard, c)
			})
			_, _, err := newTestSubscriber(t, SubscriberConfig{HandshakeTimeout: time.Second}, Endpoint{Worker: 1, Address: peer.addr()})
			if err == nil {
				t.Fatal("a peer announcing a 2^62-byte READY was accepted")
			}
		})
	}
	// The parser holds back the size's last byte, so the library never
	// sees a complete header.
	var p zmtpParser
	ok, cut := p.feed(append(make([]byte, 64), longFrame(zCommand, 1<<62)...), DefaultMaxMessageBytes)
	if ok || cut != 64+8 {
		t.Fatalf("parser: ok %v cut %d, want refused with the size's last byte held back (72)", ok, cut)
	}
}

// A peer that accepts and never greets fails the dial within the
// handshake timeout; a replay peer that never greets does not hold up
// Close; over TCP and over a unix socket alike.
func TestSilentPeersDoNotHang(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { silentPeers(t, tr) })
	}
}

func silentPeers(t *testing.T, tr string) {
	silent := newHostilePeer(t, tr, func(c net.Conn) { io.Copy(io.Discard, c) })
	start := time.Now()
	_, _, err := newTestSubscriber(t, SubscriberConfig{HandshakeTimeout: 300 * time.Millisecond}, Endpoint{Worker: 1, Address: silent.addr()})
	if err == nil {
		t.Fatal("a peer that never greets was accepted")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the dial took %v", took)
	}

	// A live engine whose replay endpoint is silent: at a gap the
	// subscriber dials the replay peer and waits in its handshake; Close
	// must not wait for it.
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, _, err := newTestSubscriber(t, SubscriberConfig{HandshakeTimeout: time.Minute},
		Endpoint{Worker: 1, Address: pub.Addr(), Replay: silent.addr(), Topic: "kv@e@"})
	if err != nil {
		t.Fatal(err)
	}
	// Either the first batch the subscriber sees is already a gap (those
	// before the subscription), or it connected in time and a batch
	// dropped on the wire makes one.
	waitSubscribed(t, pub, sub)
	if sub.Stats().GapsFound == 0 {
		pub.DropLive = func(uint64) bool { return true }
		pub.Publish([]Event{storedEvent(1)})
		pub.DropLive = nil
		pub.Publish(nil)
	}
	testwait.For(t, "the gap", func() bool { return sub.Stats().GapsFound > 0 })
	start = time.Now()
	sub.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Close took %v with a silent replay peer", took)
	}
}

// storedEvent is one BlockStored of one block.
func storedEvent(h uint64) Event {
	return Event{Type: BlockStored, BlockHashes: []uint64{h}, TokenIDs: make([]uint32, bs), BlockSize: bs, Medium: "GPU"}
}

// Sequence numbers that the engine's ring does not hold are not believed:
// a message claiming seq 2^63 after 1..5 neither adds 2^63 lost batches
// nor makes the next genuine message a "restart" that clears the worker;
// seq 2^64-1 does not wrap the expected counter; a stale message from the
// past does not clear the worker either. The final index equals the direct
// build of the genuine batches.
func TestForgedSequencesAreNotBelieved(t *testing.T) {
	want := radix.NewTree()
	e, pool, sub := connectedEngine(t)
	e.publish(t, 5, want)
	settle(t, sub, e)
	for i, forged := range []uint64{1 << 63, ^uint64(0) - 1, 2} {
		before := sub.Stats()
		// Each forgery is judged before the genuine stream goes on: else
		// the check's replay may fetch genuine batches early, which is no
		// gap either, but not what this test looks at.
		if err := e.pub.PublishAt(forged, []Event{e.gen.Step()}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); sub.Stats().SuspectSeqs < uint64(i+1); time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("forgery %d never judged: %+v", i, sub.Stats())
			}
		}
		// A forgery is no gap: nothing was missing, so none is counted
		// found, repaired or lost.
		if st := sub.Stats(); st.GapsFound != before.GapsFound || st.GapsRepaired != before.GapsRepaired || st.GapsLost != before.GapsLost {
			t.Fatalf("forgery %d counted as a gap: %+v", i, st)
		}
		e.publish(t, 3, want) // the genuine stream goes on
		settle(t, sub, e)
	}
	if err := e.pub.PublishAt(EndOfReplay, nil); err != nil {
		t.Fatal(err)
	}
	e.publish(t, 2, want)
	settle(t, sub, e)
	st := sub.Stats()
	if st.Restarts != 0 || st.BatchesLost != 0 || st.GapsLost != 0 || st.SuspectSeqs != 3 || st.BadFrames != 1 {
		t.Fatalf("stats %+v", st)
	}
	sameIndex(t, pool.Index(), want)
}

// connectedEngine is an engine with a replay ring, and a subscriber over a
// pool connected to it.
func connectedEngine(t *testing.T) (*engineUnderTest, *shardpool.Pool, *Subscriber) {
	t.Helper()
	e := newEngine(t, 1, PublisherConfig{Topic: "kv@e@m", ReplayEndpoint: "x"})
	pool := shardpool.NewPool(2, bs)
	t.Cleanup(func() { pool.Close() })
	sub, err := NewSubscriber(pool, SubscriberConfig{BlockSize: bs}, e.endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	connect(t, sub, e)
	return e, pool, sub
}

// A publisher that goes away and comes back on the same ports (an engine
// restarting) is reconnected to: the endpoint keeps receiving, resyncs as
// for a restart, and the index equals the direct build.
func TestPublisherComesBack(t *testing.T) {
	want := radix.NewTree()
	e, pool, sub := connectedEngine(t)
	e.publish(t, 10, want)
	settle(t, sub, e)
	live, replay := strings.TrimPrefix(e.pub.Addr(), "tcp://"), strings.TrimPrefix(e.pub.ReplayAddr(), "tcp://")
	e.pub.Close()
	// The engine restarts: same ports, sequence from 0, nothing cached.
	var p *Publisher
	testwait.For(t, "the ports to be free again", func() bool {
		var err error
		p, err = NewPublisher(PublisherConfig{Endpoint: "tcp://" + live, ReplayEndpoint: "tcp://" + replay, Topic: "kv@e@m"})
		return err == nil
	})
	defer p.Close()
	e.pub = p
	e.gen.Restart()
	_ = want.Apply(kvevent.RouterEvent{WorkerID: 1, Event: kvevent.Event{Data: kvevent.Cleared{}}})
	testwait.For(t, "the subscriber to reconnect", func() bool {
		if _, err := p.Publish(nil); err != nil {
			t.Fatal(err)
		}
		return sub.Stats().Restarts >= 1 && sub.Received()[0] > 0
	})
	e.publish(t, 10, want)
	settle(t, sub, e)
	sameIndex(t, pool.Index(), want)
	if st := sub.Stats(); st.Disconnects == 0 {
		t.Fatalf("the disconnect was not counted: %+v", st)
	}
}

// stallingIndexer blocks every event while stalled.
type stallingIndexer struct {
	shardpool.Indexer
	stalled atomic.Bool
	release chan struct{}
}

func (s *stallingIndexer) ApplyEvent(ev kvevent.RouterEvent) error {
	if s.stalled.Load() {
		<-s.release
	}
	return s.Indexer.ApplyEvent(ev)
}

// While the index stalls, what an endpoint holds is bounded in bytes, not
// messages: the flood waits in the engine's socket; released, every batch
// applies.
func TestQueueIsBoundedInBytes(t *testing.T) {
	e := newEngine(t, 1, PublisherConfig{Topic: "kv@e@m", ReplayEndpoint: "x"})
	pool := shardpool.NewPool(2, bs)
	defer pool.Close()
	idx := &stallingIndexer{Indexer: pool, release: make(chan struct{})}
	const limit = 256 << 10
	sub, err := NewSubscriber(idx, SubscriberConfig{BlockSize: bs, MaxQueueBytes: limit}, e.endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	connect(t, sub, e)
	idx.stalled.Store(true)
	big := NewSynthEngine(7, bs, 64, 0)
	for range 400 { // about 400 x 9 KB
		if _, err := e.pub.Publish([]Event{big.Step(), big.Step()}); err != nil {
			t.Fatal(err)
		}
	}
	queued := func() int {
		q := &sub.eps[0].queue
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.bytes
	}
	// The flood is 14 times the bound: the queue fills to within a message
	// of it, then holds there while the index stalls.
	testwait.For(t, "the queue to fill to its bound", func() bool { return queued() >= limit-64<<10 })
	peak := 0
	for range 100 {
		peak = max(peak, queued())
		time.Sleep(2 * time.Millisecond)
	}
	if peak > limit+64<<10 {
		t.Fatalf("queued %d bytes at most, want at most %d plus one message", peak, limit)
	}
	idx.stalled.Store(false)
	close(idx.release)
	settle(t, sub, e)
	if st := sub.Stats(); st.BatchesLost != 0 || st.GapsLost != 0 {
		t.Fatalf("%+v", st)
	}
}

// FuzzZMTPParser: any byte stream, in any chunking, is parsed without
// panic; a refusal holds back at most the bytes of the offending size, and
// a stream of frames within the limit is never refused.
func FuzzZMTPParser(f *testing.F) {
	f.Add(append(make([]byte, 64), 0x04, 0x02, 'h', 'i'), uint16(7), uint64(1024))
	f.Add(append(make([]byte, 64), longFrame(zCommand, 1<<62)...), uint16(3), uint64(1<<20))
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint16, limit uint64) {
		var p zmtpParser
		step := int(chunk%97) + 1
		for i := 0; i < len(stream); i += step {
			b := stream[i:min(i+step, len(stream))]
			ok, cut := p.feed(b, limit)
			if cut < 0 || cut > len(b) || (ok && cut != len(b)) {
				t.Fatalf("ok %v cut %d of %d", ok, cut, len(b))
			}
			if !ok {
				return
			}
		}
	})
}

// Frames within the limit, however chunked, pass and count their commands.
func TestZMTPParserFrames(t *testing.T) {
	s := make([]byte, 64)
	s = append(s, 0x04, 0x03, 'a', 'b', 'c') // a short command
	s = append(s, longFrame(0, 300)...)      // a long message frame
	s = append(s, make([]byte, 300)...)
	s = append(s, 0x00, 0x00) // an empty frame
	for step := 1; step <= len(s); step++ {
		var p zmtpParser
		for i := 0; i < len(s); i += step {
			if ok, _ := p.feed(s[i:min(i+step, len(s))], 300); !ok {
				t.Fatalf("step %d: a 300-byte frame refused at limit 300", step)
			}
		}
		if p.commands != 1 || p.state != zFlags || p.greeting != 64 {
			t.Fatalf("step %d: %+v", step, p)
		}
	}
	var p zmtpParser
	if ok, _ := p.feed(s, 299); ok {
		t.Fatal("a 300-byte frame passed at limit 299")
	}
}

// A clean close of a connected subscriber is no error (it used to return
// "use of closed network connection": the guard closes the connections
// before the sockets close theirs).
func TestCleanCloseIsNoError(t *testing.T) {
	e, _, sub := connectedEngine(t)
	e.publish(t, 3, radix.NewTree())
	settle(t, sub, e)
	if err := sub.Close(); err != nil {
		t.Fatalf("clean close: %v", err)
	}
}

// A silent replay address costs a gap no more than ReplayIdle: the replay
// dial's handshake is bounded by the shorter of HandshakeTimeout and
// ReplayIdle (it waited the whole handshake timeout, a minute here, for
// every gap).
func TestSilentReplayPeerCostsReplayIdle(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { silentReplayPeer(t, tr) })
	}
}

func silentReplayPeer(t *testing.T, tr string) {
	silent := newHostilePeer(t, tr, func(c net.Conn) { io.Copy(io.Discard, c) })
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, _, err := newTestSubscriber(t, SubscriberConfig{HandshakeTimeout: time.Minute, ReplayIdle: 300 * time.Millisecond},
		Endpoint{Worker: 1, Address: pub.Addr(), Replay: silent.addr(), Topic: "kv@e@"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitSubscribed(t, pub, sub)
	pub.DropLive = func(uint64) bool { return true }
	pub.Publish([]Event{storedEvent(1)})
	pub.DropLive = nil
	pub.Publish(nil)
	// Within waitFor's 10 s, where the handshake timeout is a minute.
	testwait.For(t, "the gap to be given up", func() bool { return sub.Stats().GapsLost > 0 })
}

// stallTransport dials TCP and, after the first stallAfter bytes read (the
// handshake and a little), stops reading until closed: a subscriber that
// stops reading.
type stallTransport struct{ inner transport.Transport }

const stallAfter = 4096

// registerStall registers the stalling transport once per process: zmq4
// refuses a second registration, and -count runs the test again.
var registerStall = sync.OnceValue(func() error {
	return zmq4.RegisterTransport("kvradix-stall", stallTransport{transport.New("tcp")})
})

func (s stallTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := s.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, closed: make(chan struct{})}, nil
}

func (s stallTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return s.inner.Listen(ctx, addr)
}

func (s stallTransport) Addr(ep string) (string, error) { return s.inner.Addr(ep) }

type stallConn struct {
	net.Conn
	read   int
	closed chan struct{}
	once   sync.Once
}

func (c *stallConn) Read(b []byte) (int, error) {
	if c.read >= stallAfter {
		<-c.closed
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b[:min(len(b), stallAfter-c.read)])
	c.read += n
	return n, err
}

func (c *stallConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// A subscriber that stops reading is cut after SlowAfter, and holds the
// healthy subscriber back no longer: it receives every batch (it stalled
// at 20,045 of 23,000 while the send queue grew), and the cut is counted.
func TestSlowSubscriberIsCut(t *testing.T) {
	if err := registerStall(); err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m", SlowAfter: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	stalled := zmq4.NewSub(context.Background())
	defer stalled.Close()
	if err := stalled.Dial("kvradix-stall://" + strings.TrimPrefix(pub.Addr(), "tcp://")); err != nil {
		t.Fatal(err)
	}
	if err := stalled.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	sub, _, err := newTestSubscriber(t, SubscriberConfig{}, Endpoint{Worker: 1, Address: pub.Addr(), Topic: "kv@e@"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitSubscribed(t, pub, sub)
	batch := make([]Event, 100)
	for i := range batch {
		batch[i] = storedEvent(uint64(i + 1))
	}
	var last uint64
	for range 2000 {
		if last, err = pub.Publish(batch); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "the healthy subscriber to receive every batch", func() bool { return sub.Received()[0] >= last })
	if pub.SlowSubscribers() == 0 {
		t.Fatal("the stalled subscriber was not cut")
	}
}

// Sixteen hostile peers connect to a Listen endpoint at once, each
// announcing a 60 MiB frame: the endpoint holds at most MaxConns of them,
// refuses every frame past the 16 MiB limit before anything is allocated,
// and the process's heap stays far under 512 MB (it reached 1.69 GB: one
// whole frame allocated per connection, and more queued).
func TestHostileConnectionsAreBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	sub, _, err := newTestSubscriber(t, SubscriberConfig{}, Endpoint{Worker: 1, Address: "tcp://" + addr, Listen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var peers sync.WaitGroup
	stop := make(chan struct{})
	for range 16 {
		peers.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer c.Close()
			if greet(c) != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
			c.Write(longFrame(0, 60<<20))
			go func() { <-stop; c.Close() }()
			io.Copy(io.Discard, c)
		})
	}
	testwait.For(t, "every hostile connection to be turned away or its frame refused", func() bool {
		st := sub.Stats()
		return st.FramesRefused+st.ConnsRefused >= 16
	})
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	close(stop)
	peers.Wait()
	if ms.HeapAlloc > 256<<20 {
		t.Fatalf("heap at %d MiB with 16 hostile connections", ms.HeapAlloc>>20)
	}
}

// A subscriber resumed from a saved position repairs from there when the
// engine's ring still holds it; when the ring no longer reaches back that
// far, the worker's blocks are cleared (stale) and counted.
func TestResumeAt(t *testing.T) {
	pub := ringOf20(t)
	for _, tc := range []struct {
		resumeAt uint64
		cleared  uint64
	}{{16, 0}, {3, 1}} {
		sub, _, err := newTestSubscriber(t, SubscriberConfig{}, Endpoint{Worker: 1, Address: pub.Addr(), Replay: pub.ReplayAddr(), Topic: "kv@e@", ResumeAt: tc.resumeAt})
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "the resumed subscriber to repair", func() bool {
			pub.Publish(nil)
			return sub.Stats().GapsRepaired+sub.Stats().GapsLost > 0
		})
		st := sub.Stats()
		if st.ResumesCleared != tc.cleared || (tc.cleared == 0 && (st.Replayed < 4 || st.GapsLost != 0)) {
			t.Errorf("resumed at %d: %+v", tc.resumeAt, st)
		}
		sub.Close()
	}
}

// ringOf20 is a publisher that has published 20 batches, a store each, of
// which its replay ring holds the last 8.
func ringOf20(t *testing.T) *Publisher {
	t.Helper()
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m", BufferSteps: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	for i := range 20 {
		if _, err := pub.Publish([]Event{storedEvent(uint64(i + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	return pub
}

// A subscriber resumed from a saved position catches up from the engine's
// ring at once, before the engine publishes again (an idle engine's last
// batches were applied only with its next one), and says so (CaughtUp).
func TestCatchUpWithoutANewBatch(t *testing.T) {
	pub := ringOf20(t)
	sub, _, err := newTestSubscriber(t, SubscriberConfig{}, Endpoint{Worker: 1, Address: pub.Addr(), Replay: pub.ReplayAddr(), Topic: "kv@e@", ResumeAt: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	testwait.For(t, "caught up", sub.CaughtUp)
	if st := sub.Stats(); st.Replayed != 4 || st.GapsRepaired != 1 || st.ResumesCleared != 0 || sub.Received()[0] != 20 {
		t.Fatalf("caught up at %v: %+v", sub.Received(), st)
	}
}

// A fresh subscriber catches up at once, too, on what the engine published
// before it subscribed (PUB/SUB drops it, and an idle engine may not send
// another batch for long): all of it where the ring holds it all, else the
// ring's batches, the older ones counted lost. The engine was heard from
// then, though no live message came: its endpoint's LastMessage says when
// (kvradix serve's last-message metric and its staleness check read it).
func TestFreshCatchUpWithoutANewBatch(t *testing.T) {
	all, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	for i := range 5 {
		if _, err := all.Publish([]Event{storedEvent(uint64(i + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name                     string
		pub                      *Publisher
		replayed, repaired, lost uint64
		batchesLost, received    uint64
	}{
		{"the ring holds it all", all, 5, 1, 0, 0, 5},
		{"the ring holds the last 8 of 20", ringOf20(t), 8, 0, 1, 12, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub, _, err := newTestSubscriber(t, SubscriberConfig{}, Endpoint{Worker: 1, Address: tc.pub.Addr(), Replay: tc.pub.ReplayAddr(), Topic: "kv@e@"})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			testwait.For(t, "caught up", sub.CaughtUp)
			st := sub.Stats()
			if st.Replayed != tc.replayed || st.Batches != tc.replayed || st.GapsRepaired != tc.repaired || st.GapsLost != tc.lost || st.BatchesLost != tc.batchesLost || sub.Received()[0] != tc.received {
				t.Fatalf("caught up at %v: %+v", sub.Received(), st)
			}
			if last := sub.States()[0].LastMessage; last.IsZero() {
				t.Fatal("caught up, but the endpoint never heard from its engine")
			}
		})
	}
}

// An idle engine's last batch, dropped on the wire, is repaired from its
// ring once the endpoint has heard nothing for IdleReplay, without the
// engine's next batch (never, with IdleReplay negative). A restart while
// it was idle is not taken for the same life: the ring no longer holds
// the last batch applied, so it is not asked (a restarted engine's new
// connection shows the restart: see checkReconnect).
func TestIdleReplay(t *testing.T) {
	newIdle := func(t *testing.T, every time.Duration) (*Publisher, *Subscriber) {
		pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		sub, _, err := newTestSubscriber(t, SubscriberConfig{IdleReplay: every}, Endpoint{Worker: 1, Address: pub.Addr(), Replay: pub.ReplayAddr(), Topic: "kv@e@"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Close() })
		waitSubscribed(t, pub, sub)
		// Settled: every batch published so far applied.
		seq, err := pub.Publish(nil)
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "the subscriber to settle", func() bool { return sub.Received()[0] == seq+1 })
		return pub, sub
	}
	dropOne := func(t *testing.T, pub *Publisher) uint64 {
		pub.DropLive = func(uint64) bool { return true }
		defer func() { pub.DropLive = nil }()
		seq, err := pub.Publish([]Event{storedEvent(1)})
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	t.Run("repaired", func(t *testing.T) {
		pub, sub := newIdle(t, 20*time.Millisecond)
		seq := dropOne(t, pub)
		testwait.For(t, "the dropped batch", func() bool { return sub.Received()[0] == seq+1 })
		if st := sub.Stats(); st.GapsRepaired == 0 || st.GapsLost != 0 || st.Restarts != 0 {
			t.Fatalf("%+v", st)
		}
	})
	t.Run("off", func(t *testing.T) {
		pub, sub := newIdle(t, -1)
		seq := dropOne(t, pub)
		time.Sleep(200 * time.Millisecond)
		if got := sub.Received()[0]; got != seq {
			t.Fatalf("received up to %d, want %d: the dropped batch applied without a next one", got, seq)
		}
	})
	t.Run("restarted while idle", func(t *testing.T) {
		pub, sub := newIdle(t, 20*time.Millisecond)
		at, batches := sub.Received()[0], sub.Stats().Batches
		pub.DropLive = func(uint64) bool { return true }
		pub.Restart()
		for i := range at + 3 { // the new life's ring passes the old life's last sequence
			if _, err := pub.Publish([]Event{storedEvent(uint64(100 + i))}); err != nil {
				t.Fatal(err)
			}
		}
		// Two idle asks answered: the first has decided (an endpoint asks
		// one at a time), and without the check it would have applied the
		// new life's batches by now.
		asked := pub.ReplayRequests()
		testwait.For(t, "two idle asks", func() bool { return pub.ReplayRequests() >= asked+2 })
		if got, st := sub.Received()[0], sub.Stats(); got != at || st.Batches != batches || st.Restarts != 0 {
			t.Fatalf("received up to %d (was %d), %+v: another life taken for the same", got, at, st)
		}
	})
}

// waitSubscribed publishes empty batches until sub has seen one of them (or
// the gap their sequence numbers open), so that later publishes reach it.
func waitSubscribed(t *testing.T, pub *Publisher, sub *Subscriber) {
	t.Helper()
	testwait.For(t, "the subscription", func() bool {
		pub.Publish(nil)
		return sub.Received()[0] > 0 || sub.Stats().GapsFound > 0
	})
}

// Pause stops applying between messages until resumed: the positions and
// the index stay a consistent cut while the engine goes on publishing; a
// second Pause meanwhile gives up with its context, leaving nothing held;
// after resume everything published is applied.
func TestPause(t *testing.T) {
	want := radix.NewTree()
	e, pool, sub := connectedEngine(t)
	e.publish(t, 20, want)
	settle(t, sub, e)
	resume, err := sub.Pause(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	at := sub.Received()[0]
	if _, err := pool.Flush(); err != nil {
		t.Fatal(err)
	}
	held, err := holdings.Of(pool.Index())
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, 20, want)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := sub.Pause(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second Pause while paused: %v, want the deadline", err)
	}
	// The 20 batches had 100 ms to arrive: none may have been applied.
	if _, err := pool.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := sub.Received()[0]; got != at {
		t.Fatalf("paused at %d, then at %d", at, got)
	}
	if d := held.DiffIndex(pool.Index()); d != "" {
		t.Fatalf("the index changed while paused: %s", d)
	}
	resume()
	resume() // once only: a second call is harmless
	settle(t, sub, e)
	sameIndex(t, pool.Index(), want)
}

// settledEngine is an engine with a replay endpoint and a subscriber
// (200 ms handshake timeout) that has applied its first n batches.
func settledEngine(t *testing.T, n int) (*engineUnderTest, *Subscriber) {
	t.Helper()
	e := newEngine(t, 1, PublisherConfig{Topic: "kv@e@m", ReplayEndpoint: "x"})
	pool := shardpool.NewPool(1, bs)
	t.Cleanup(func() { pool.Close() })
	sub, err := NewSubscriber(pool, SubscriberConfig{BlockSize: bs, HandshakeTimeout: 200 * time.Millisecond}, e.endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	connect(t, sub, e)
	e.publish(t, n, radix.NewTree())
	settle(t, sub, e)
	return e, sub
}

// An engine away for longer than the handshake timeout (a restart takes
// its time) is still reconnected to: reconnects retry for as long as the
// subscriber lives, not HandshakeTimeout's worth of tries (it never was
// heard from again).
func TestPublisherComesBackLate(t *testing.T) {
	e, sub := settledEngine(t, 10)
	live, replay := strings.TrimPrefix(e.pub.Addr(), "tcp://"), strings.TrimPrefix(e.pub.ReplayAddr(), "tcp://")
	e.pub.Close()
	time.Sleep(time.Second) // away for five handshake timeouts: the scenario, not a wait
	var p *Publisher
	testwait.For(t, "the ports to be free again", func() bool {
		var err error
		p, err = NewPublisher(PublisherConfig{Endpoint: "tcp://" + live, ReplayEndpoint: "tcp://" + replay, Topic: "kv@e@m"})
		return err == nil
	})
	defer p.Close()
	testwait.For(t, "the subscriber to reconnect", func() bool {
		if _, err := p.Publish(nil); err != nil {
			t.Fatal(err)
		}
		return sub.Stats().Restarts >= 1
	})
}

// An engine that goes away shows as down (its connection was left
// half-open and never reported), and is redialled ever more rarely, not
// every 50 ms for good. (Coming back later than before, a restarted engine
// is still known for one: TestPublisherComesBackLate.)
func TestDeadEngineIsDownAndBackedOff(t *testing.T) {
	e, sub := settledEngine(t, 5)
	if sub.States()[0].Down {
		t.Fatal("down while connected")
	}
	e.pub.Close()
	testwait.For(t, "the engine to show as down", func() bool { return sub.States()[0].Down })
	before := sub.Stats().Dials
	time.Sleep(3 * time.Second) // the scenario: three seconds away, not a wait
	if n := sub.Stats().Dials - before; n > 20 {
		t.Fatalf("%d dials in 3 s to a dead engine, want them backed off (every 50 ms is 60)", n)
	}
}
