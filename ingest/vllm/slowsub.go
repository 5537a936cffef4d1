package vllm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// DefaultSlowAfter is PublisherConfig.SlowAfter's default.
const DefaultSlowAfter = time.Second

// slowCutter is a publisher's transport for its PUB socket: every
// subscriber connection it accepts gets a deadline on each write, and one
// that cannot take a write within the deadline (a subscriber that stopped
// reading) is cut. zmq4's PUB socket writes each message to its
// subscribers one after another from one queue with no high-water mark,
// so a stalled subscriber held every other back while the queue grew
// without bound; libzmq drops a slow subscriber's messages at its
// high-water mark instead. Cutting it has the same effect for the others
// (they wait at most the deadline, once) and costs the slow one nothing it
// cannot repair: it reconnects and replays what it missed from the ring.
type slowCutter struct {
	scheme string
	inner  transport.Transport
	after  time.Duration
	cut    atomic.Uint64 // subscribers cut
}

var slowCutterSeq atomic.Uint64

// newSlowCutter registers a cutter for TCP endpoints (zmq4 keeps a
// transport for the life of the process; a cutter is a few words).
func newSlowCutter(after time.Duration) (*slowCutter, error) {
	c := &slowCutter{scheme: fmt.Sprintf("kvradix-pub-%d", slowCutterSeq.Add(1)), inner: transport.New("tcp"), after: after}
	if err := zmq4.RegisterTransport(c.scheme, c); err != nil {
		return nil, err
	}
	return c, nil
}

// endpoint rewrites a tcp:// endpoint onto the cutter; others pass as
// they are.
func (c *slowCutter) endpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return c.scheme + "://" + rest
	}
	return ep
}

// Dial implements transport.Transport (a PUB socket only listens).
func (c *slowCutter) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	return c.inner.Dial(ctx, d, addr)
}

// Listen implements transport.Transport.
func (c *slowCutter) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := c.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return cutterListener{l, c}, nil
}

// Addr implements transport.Transport.
func (c *slowCutter) Addr(ep string) (string, error) { return c.inner.Addr(ep) }

type cutterListener struct {
	net.Listener
	c *slowCutter
}

func (l cutterListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &cutterConn{Conn: conn, c: l.c}, nil
}

// cutterConn is a subscriber's connection whose writes have a deadline.
type cutterConn struct {
	net.Conn
	c    *slowCutter
	dead atomic.Bool
}

func (w *cutterConn) Write(b []byte) (int, error) {
	if w.dead.Load() {
		return 0, net.ErrClosed
	}
	if err := w.Conn.SetWriteDeadline(time.Now().Add(w.c.after)); err != nil {
		return 0, err
	}
	n, err := w.Conn.Write(b)
	if ne, ok := err.(net.Error); ok && ne.Timeout() && !w.dead.Swap(true) {
		w.c.cut.Add(1)
		w.Conn.Close()
		return n, errors.Join(errSlowSubscriber, err)
	}
	return n, err
}

var errSlowSubscriber = errors.New("vllm: publisher: subscriber cut for not reading")
