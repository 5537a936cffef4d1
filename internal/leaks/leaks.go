// Package leaks names the goroutines the libraries leave behind that a
// test's leak check must not count as ours; test mains only import it.
package leaks

import "go.uber.org/goleak"

// Ignore returns goleak's options for the libraries' goroutines:
//   - zmq4's PUB writer waits on a condition variable after its socket
//     closed (it holds no messages);
//   - nats.go's ack reset of a JetStream context, whose connection closed
//     before it started, waits on a nil channel for good (one per closed
//     connection, seen after a server restart and at service shutdown).
func Ignore() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
	}
}
