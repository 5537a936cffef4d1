package cluster

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Directory lists the streams of a NATS server, so that a process can
// find the buses others created (by their subjects, with the metadata
// recorded on them: Config.Metadata).
type Directory struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// StreamInfo is a stream a Directory found.
type StreamInfo struct {
	Name     string
	Metadata map[string]string
}

// OpenDirectory connects to the NATS server at url.
func OpenDirectory(url string, auth Auth) (*Directory, error) {
	nc, err := dial(url, auth)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &Directory{nc: nc, js: js}, nil
}

// Streams lists the streams taking subjects under subject (a NATS
// wildcard, "kv.>"), with their metadata.
func (d *Directory) Streams(ctx context.Context, subject string) ([]StreamInfo, error) {
	l := d.js.ListStreams(ctx, jetstream.WithStreamListSubject(subject))
	var out []StreamInfo
	for si := range l.Info() {
		out = append(out, StreamInfo{Name: si.Config.Name, Metadata: si.Config.Metadata})
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("cluster: list streams: %w", err)
	}
	return out, nil
}

// Close closes the connection.
func (d *Directory) Close() { d.nc.Close() }
