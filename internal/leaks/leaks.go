// Package leaks names the goroutines left behind after a test that its
// leak check must not count as leaks; test mains only import it.
package leaks

import "go.uber.org/goleak"

// Ignore returns goleak's options for the goroutines that end on their
// own or for good after a test, ours and the libraries':
//   - a warm internal/pages started ahead of a grown index's growth
//     (pages.WarmAhead) ends after its collection, seconds at most;
//   - zmq4's PUB writer waits on a condition variable after its socket
//     closed (it holds no messages);
//   - nats.go's ack reset of a JetStream context, whose connection closed
//     before it started, waits on a nil channel for good (one per closed
//     connection, seen after a server restart and at service shutdown).
func Ignore() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/kvradix/kvradix/internal/pages.warmAhead.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
	}
}
