package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvradix/kvradix/cluster"
	"github.com/kvradix/kvradix/radix/holdings"
)

// inject makes -faults' faults before request i: a hostile client;
// replica 1 snapshots its index (as it would every so often), dies, its
// snapshot is corrupted, and a new replica takes its place from a good
// one; the server restarts (the clients reconnect, JetStream keeps the
// stream on disk); the stream is lost.
func (p *clusterPolicy) inject(i int) error {
	switch {
	case p.loseAt > 0 && i == p.loseAt:
		return p.loseStream()
	case p.hostileAt > 0 && i == p.hostileAt:
		return p.hostile()
	case p.killAt > 0 && i == p.killAt:
		victim := p.replicas[1]
		if _, err := victim.follow.Snapshot(p.ctx, victim.pool.Index()); err != nil {
			return err
		}
		victim.close()
		if err := p.corruptSnapshot(); err != nil {
			return err
		}
		r, err := p.newReplica(1) // from the snapshot: refused, it is corrupt
		if !errors.Is(err, cluster.ErrCorruptSnapshot) {
			if err == nil {
				r.close()
			}
			return fmt.Errorf("a corrupt snapshot was not refused: %v", err)
		}
		p.snapshotsRefused++
		// Another replica writes a good one, and the new replica starts
		// from that.
		if _, err := p.replicas[0].follow.Snapshot(p.ctx, p.replicas[0].pool.Index()); err != nil {
			return err
		}
		r, err = p.newReplica(1)
		if err != nil {
			return err
		}
		p.replicas[1] = r
		p.dead = append(p.dead, victim)
		p.replicaRestarts++
	case p.restartAt > 0 && i == p.restartAt:
		p.serverRestarts++
		return p.restart()
	}
	return nil
}

// loseStream deletes the event stream, as a server that lost its data
// would have it. Every replica finds its stream reset below it
// (StreamResetError) and is replaced by one that starts clean on the
// stream the bus re-creates; the reference starts clean too, so replicas
// and reference are compared on what the stream holds from then on.
func (p *clusterPolicy) loseStream() error {
	js, closeJS, err := p.outsider()
	if err != nil {
		return err
	}
	defer closeJS()
	if err := js.DeleteStream(p.ctx, p.stream); err != nil {
		return err
	}
	for k, r := range p.replicas {
		var reset *cluster.StreamResetError
		if err := r.follow.CatchUp(p.ctx); !errors.As(err, &reset) {
			return fmt.Errorf("replica %d did not see its stream reset: %v", k, err)
		}
		p.streamResets++
		r.close()
		fresh, err := p.newReplica(0)
		if err != nil {
			return err
		}
		p.replicas[k] = fresh
		p.dead = append(p.dead, r)
	}
	p.ref = holdings.Set{}
	return nil
}

// hostile is a local client's attack: connecting without the server's
// token (refused), then, with it, forging load messages from a made-up
// replica (completions and first tokens of every request in flight,
// admissions of 2^40-token prompts, garbage): every sharing replica drops
// them, and the run goes on as if they had never been sent.
func (p *clusterPolicy) hostile() error {
	u, err := url.Parse(p.url)
	if err != nil {
		return err
	}
	bare := *u
	bare.User = nil
	if nc, err := nats.Connect(bare.String(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		return fmt.Errorf("a client without the token connected to %s", bare.Redacted())
	}
	p.hostileRefused = true
	nc, err := nats.Connect(p.url)
	if err != nil {
		return err
	}
	defer nc.Close()
	var ops []map[string]any
	for id := range p.owner {
		ops = append(ops, map[string]any{"k": 'f', "id": id}, map[string]any{"k": 'c', "id": id})
	}
	for range 20 {
		ops = append(ops, map[string]any{"k": 'a', "id": uuid.New(), "a": map[string]any{
			"worker": map[string]any{"ID": 0}, "isl": int64(1) << 40, "blocks": []uint64{}, "overlap": 0}})
	}
	b, err := json.Marshal(map[string]any{"r": uuid.New(), "s": 1, "ops": ops})
	if err != nil {
		return err
	}
	for _, msg := range [][]byte{b, []byte("{garbage")} {
		if err := nc.Publish(p.loadSubject, msg); err != nil {
			return err
		}
	}
	return nc.Flush()
}

// outsider is a JetStream client of the server's own, with its token: a
// hostile local process, or the fault a lost disk would be.
func (p *clusterPolicy) outsider() (jetstream.JetStream, func(), error) {
	nc, err := nats.Connect(p.url)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}

// corruptSnapshot flips a byte of the stored snapshot, as a disk or a
// hostile client might.
func (p *clusterPolicy) corruptSnapshot() error {
	js, closeJS, err := p.outsider()
	if err != nil {
		return err
	}
	defer closeJS()
	store, err := js.ObjectStore(p.ctx, p.bucket)
	if err != nil {
		return err
	}
	snap, err := store.GetBytes(p.ctx, "index")
	if err != nil {
		return err
	}
	snap[len(snap)/2] ^= 0x40
	_, err = store.PutBytes(p.ctx, "index", snap)
	return err
}
