package vllm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// go-zeromq/zmq4 allocates a frame's body from the size its peer claims
// (make([]byte, size), up to 2^63) and has no deadline on the handshake: a
// peer can end the process with one header, or hang a dial forever. The
// guard wraps the library's TCP and IPC transports: it reads the ZMTP
// stream as it passes and refuses, before the library sees the whole
// header, a frame larger than the limit; it puts a deadline on the
// handshake; and it can close every connection it made, so that Close
// returns whatever the peers do.

// closeReceiver closes a socket that receives and frees its readers.
// go-zeromq/zmq4 v0.17's reader, one goroutine per connection, hands over
// each message it read before it looks at the socket's context: once the
// socket is closed and nobody receives, a reader blocked on the full queue
// (10 messages) stays forever, and so do the messages. A replay abandoned
// mid-stream (every gap repaired, every restart checked) left one behind.
// Each Recv after Close either takes a queued message or reports the
// closed context, chosen at random, so receiving until 32 reports in a row
// frees every blocked reader but with odds of 2^-32.
func closeReceiver(s zmq4.Socket) error {
	err := s.Close()
	for quiet, tries := 0, 0; quiet < 32 && tries < 4096; tries++ {
		if _, e := s.Recv(); e != nil {
			quiet++
		} else {
			quiet = 0
		}
	}
	return err
}

// DefaultMaxMessageBytes is SubscriberConfig.MaxMessageBytes's default, 16
// MiB. vLLM publishes one batch a step: one BlockStored per request that
// filled blocks, with its token ids (at most 5 bytes each in msgpack) and
// block hashes. A million-token prefill, the longest context vLLM serves,
// is at most ~5 MiB of token ids and ~0.6 MiB of hashes at block size 16;
// 16 MiB leaves room for a step of several such requests. A frame is
// allocated whole when its header is read, so the limit is what each
// message a peer announces can cost (see SubscriberConfig.MaxConns).
const DefaultMaxMessageBytes = 16 << 20

// DefaultMaxConns is SubscriberConfig.MaxConns's default.
const DefaultMaxConns = 4

// DefaultHandshakeTimeout is SubscriberConfig.HandshakeTimeout's default.
const DefaultHandshakeTimeout = 5 * time.Second

// ErrFrameTooLarge is the read error of a connection whose peer announced a
// frame larger than the limit; the connection is dropped.
var ErrFrameTooLarge = errors.New("vllm: zmtp frame larger than the limit")

// guard is one subscriber's transport: registered with zmq4 under schemes
// of its own, one for TCP and one for IPC (unix sockets), it wraps every
// connection dialled or accepted through it. A local peer is no more to be
// trusted than a remote one: an ipc:// peer that never greets, or announces
// a frame of 2^50 bytes, would hang or end the process just the same.
type guard struct {
	tcp, ipc   string // the schemes
	limit      uint64
	handshake  time.Duration
	maxConns   int           // per listener
	refused    atomic.Uint64 // frames refused for their size
	timeouts   atomic.Uint64 // handshakes that ran out of time
	turnedAway atomic.Uint64 // connections refused past a listener's cap

	mu     sync.Mutex
	conns  map[*guardConn]struct{}
	peers  map[string]*peerState // by dialled address
	closed bool
}

// peerState is what the guard knows of one dialled peer: its connections
// that completed the handshake and are not closed (none, once one has: the
// peer is down), and the dials that failed since the last good one, which
// space out the next (redialBackoff).
type peerState struct {
	live     atomic.Int64
	fails    atomic.Int64
	lastFail atomic.Int64 // Unix ns
	dials    atomic.Uint64
	conns    atomic.Uint64 // connections that completed the handshake, ever
}

// fail records a failed dial (or a connection that never greeted).
func (p *peerState) fail() {
	p.lastFail.Store(time.Now().UnixNano())
	p.fails.Add(1)
}

// down reports whether the peer was up and has no connection now.
func (p *peerState) down() bool { return p.conns.Load() > 0 && p.live.Load() == 0 }

// redialBackoff is the wait before a dial after fails failed ones: 50 ms,
// doubling, at most 5 s (the library's own retry adds its 50 ms).
func redialBackoff(fails int64) time.Duration {
	if fails <= 0 {
		return 0
	}
	return min(50*time.Millisecond<<min(fails-1, 16), 5*time.Second)
}

// peer returns the state of the peer at a dialled address.
func (g *guard) peer(addr string) *peerState {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peers[addr]
	if p == nil {
		p = &peerState{}
		g.peers[addr] = p
	}
	return p
}

var guardSeq atomic.Uint64

// newGuard registers a guard for TCP and IPC endpoints. (zmq4 keeps a
// transport for the life of the process; a guard is a few words.)
func newGuard(limit int, handshake time.Duration, maxConns int) (*guard, error) {
	n := guardSeq.Add(1)
	g := &guard{tcp: fmt.Sprintf("kvradix-tcp-%d", n), ipc: fmt.Sprintf("kvradix-ipc-%d", n),
		limit: uint64(limit), handshake: handshake, maxConns: maxConns, conns: map[*guardConn]struct{}{}, peers: map[string]*peerState{}}
	if err := zmq4.RegisterTransport(g.tcp, guardTransport{g, transport.New("tcp")}); err != nil {
		return nil, err
	}
	if err := zmq4.RegisterTransport(g.ipc, guardTransport{g, transport.New("unix")}); err != nil {
		return nil, err
	}
	return g, nil
}

// endpoint rewrites a tcp:// or ipc:// endpoint onto the guard; others
// (inproc://, within the process) pass as they are.
func (g *guard) endpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return g.tcp + "://" + rest
	}
	if rest, ok := strings.CutPrefix(ep, "ipc://"); ok {
		return g.ipc + "://" + rest
	}
	return ep
}

// guardTransport is one of the guard's schemes over the library's
// transport for it.
type guardTransport struct {
	g     *guard
	inner transport.Transport
}

// Dial implements transport.Transport: after failed dials to the peer
// (refused, or no handshake), it refuses at once, without dialling, until
// redialBackoff has passed since the last failure: the library's retries
// (every 50 ms) then reach a dead engine ever more rarely, not every 50 ms
// for good.
func (t guardTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	p := t.g.peer(addr)
	if fails := p.fails.Load(); fails > 0 && time.Since(time.Unix(0, p.lastFail.Load())) < redialBackoff(fails) {
		return nil, errBackingOff
	}
	p.dials.Add(1)
	c, err := t.inner.Dial(ctx, d, addr)
	if err != nil {
		p.fail()
		return nil, err
	}
	gc, err := t.g.wrap(c)
	if gc != nil {
		gc.peer = p
	}
	return gc, err
}

// errBackingOff is a dial not made: the peer failed too recently.
var errBackingOff = errors.New("vllm: backing off a peer that failed")

// Listen implements transport.Transport. Each listener accepts at most
// maxConns connections at a time; more are closed as they come and
// counted.
func (t guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &guardListener{Listener: l, g: t.g}, nil
}

// Addr implements transport.Transport.
func (t guardTransport) Addr(ep string) (string, error) { return t.inner.Addr(ep) }

type guardListener struct {
	net.Listener
	g      *guard
	active atomic.Int64 // connections accepted and not closed
}

func (l *guardListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.active.Add(1) > int64(l.g.maxConns) {
			l.active.Add(-1)
			l.g.turnedAway.Add(1)
			c.Close()
			continue
		}
		gc, err := l.g.wrap(c)
		if err != nil {
			l.active.Add(-1)
			return nil, err
		}
		gc.onClose = func() { l.active.Add(-1) }
		return gc, nil
	}
}

func (g *guard) wrap(c net.Conn) (*guardConn, error) {
	gc := &guardConn{Conn: c, g: g}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	g.conns[gc] = struct{}{}
	if err := c.SetReadDeadline(time.Now().Add(g.handshake)); err != nil {
		delete(g.conns, gc)
		c.Close()
		return nil, err
	}
	return gc, nil
}

// close closes every connection and refuses new ones.
func (g *guard) close() {
	g.mu.Lock()
	g.closed = true
	conns := g.conns
	g.conns = map[*guardConn]struct{}{}
	g.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

// guardConn is a connection whose incoming ZMTP stream is parsed as it is
// read (the library's own reads are not touched, only cut short).
type guardConn struct {
	net.Conn
	g       *guard
	p       zmtpParser
	onClose func()      // a listener's count, if accepted
	peer    *peerState  // if dialled
	counted atomic.Bool // in peer.live
	closed  atomic.Bool
	ended   atomic.Bool // read failed or closed: out of peer.live

	// The library reads each frame's header and body apart, a system call
	// each; once the peer has greeted, small reads are served from
	// buf[r:w], filled readAhead bytes at a time, and err waits until it is
	// drained. (Before, reads go straight through: connections that end in
	// their handshake, dial retries and hostile peers, cost no buffer.)
	buf  []byte
	r, w int
	err  error
}

// readAhead is how much a connection reads at once for small reads: a
// live stream's frames are a few hundred bytes to a few KiB, so one
// system call serves several of the library's reads.
const readAhead = 8 << 10

func (c *guardConn) Read(b []byte) (int, error) {
	if c.r == c.w {
		if c.err != nil || len(b) >= readAhead || !c.p.greeted() {
			err := c.err
			c.err = nil
			if err != nil {
				return 0, err
			}
			return c.read(b)
		}
		if c.buf == nil {
			c.buf = make([]byte, readAhead)
		}
		c.r = 0
		c.w, c.err = c.read(c.buf)
		if c.w == 0 {
			err := c.err
			c.err = nil
			return 0, err
		}
	}
	n := copy(b, c.buf[c.r:c.w])
	c.r += n
	return n, nil
}

// read reads from the connection, following the ZMTP stream: a frame over
// the limit closes the connection, and b is cut before it.
func (c *guardConn) read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		ok, cut := c.p.feed(b[:n], c.g.limit)
		if !ok {
			c.g.refused.Add(1)
			c.end(true) // a hostile peer: its redials wait too
			c.Conn.Close()
			return cut, ErrFrameTooLarge
		}
		if c.p.greeted() && !c.p.clearedDeadline {
			c.p.clearedDeadline = true
			_ = c.Conn.SetReadDeadline(time.Time{})
			if c.peer != nil {
				c.counted.Store(true)
				c.peer.fails.Store(0)
				c.peer.live.Add(1)
				c.peer.conns.Add(1)
			}
		}
	}
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() && !c.p.greeted() {
			c.g.timeouts.Add(1)
		}
		// The peer is gone (or never greeted): the connection is closed
		// here, not left half-open (CLOSE-WAIT) for the library.
		c.end(!c.p.greeted())
		c.Conn.Close()
	}
	return n, err
}

// end takes the connection out of its peer's live count, once; a
// connection that never completed its handshake counts as a failed dial.
func (c *guardConn) end(failed bool) {
	if c.peer == nil || c.ended.Swap(true) {
		return
	}
	if c.counted.Load() {
		c.peer.live.Add(-1)
	}
	if failed {
		c.peer.fail()
	}
}

func (c *guardConn) Close() error {
	c.g.mu.Lock()
	delete(c.g.conns, c)
	c.g.mu.Unlock()
	c.end(false)
	if !c.closed.Swap(true) && c.onClose != nil {
		c.onClose()
	}
	return c.Conn.Close()
}

// zmtpParser follows a ZMTP 3 stream: the 64-byte greeting, then frames
// (a flags byte; a one-byte size, or with the LONG flag an eight-byte
// one; the body). The handshake is done with the first complete command
// (READY).
type zmtpParser struct {
	greeting        int // greeting bytes seen, up to 64
	state           uint8
	flags           byte
	size            uint64 // the size being read, then the body left
	sizeLeft        int    // size bytes still to come
	commands        int    // complete command frames
	clearedDeadline bool
}

const (
	zFlags uint8 = iota
	zSize
	zBody
)

const (
	zLong    = 0x02
	zCommand = 0x04
)

func (p *zmtpParser) greeted() bool { return p.commands > 0 }

// feed consumes b; it returns false, with how many bytes of b may still be
// delivered (those before the offending size's last byte), if a frame
// claims more than limit bytes.
func (p *zmtpParser) feed(b []byte, limit uint64) (bool, int) {
	for i := 0; i < len(b); {
		if p.greeting < 64 {
			k := min(64-p.greeting, len(b)-i)
			p.greeting += k
			i += k
			continue
		}
		switch p.state {
		case zFlags:
			p.flags, p.size = b[i], 0
			p.sizeLeft = 1
			if p.flags&zLong != 0 {
				p.sizeLeft = 8
			}
			p.state = zSize
			i++
		case zSize:
			p.size = p.size<<8 | uint64(b[i])
			p.sizeLeft--
			if p.sizeLeft > 0 {
				i++
				continue
			}
			if p.size > limit {
				return false, i
			}
			i++
			p.endOrBody()
		case zBody:
			k := uint64(len(b) - i)
			if k >= p.size {
				i += int(p.size)
				p.size = 0
				p.endOrBody()
				continue
			}
			p.size -= k
			i = len(b)
		}
	}
	return true, len(b)
}

// endOrBody moves on once a frame's size is known or its body is read.
func (p *zmtpParser) endOrBody() {
	if p.state == zSize && p.size > 0 {
		p.state = zBody
		return
	}
	if p.flags&zCommand != 0 {
		p.commands++
	}
	p.state = zFlags
}
