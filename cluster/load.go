package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/kvradix/kvradix/router"
)

// Load sharing: each replica publishes its admissions, first tokens and
// completions on core NATS, batched (at most Every late), with a heartbeat
// when it has nothing to say; the others count them in their schedulers as
// remote load, and drop a replica's load when it has been silent for
// Timeout. Without this, replicas behind a load balancer each see only
// their own requests and all send the next one to the same "least loaded"
// worker.

// ShareConfig configures load sharing.
type ShareConfig struct {
	Auth                  // credentials and TLS for the NATS server
	Subject string        // "kv.load"
	Every   time.Duration // the most an update waits to be sent (1ms)
	Timeout time.Duration // a replica silent this long has its load dropped (3s)
}

func (c *ShareConfig) defaults() {
	if c.Subject == "" {
		c.Subject = "kv.load"
	}
	if c.Every <= 0 {
		c.Every = time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = 3 * time.Second
	}
}

// loadOp is one admission, first token or completion.
type loadOp struct {
	Kind  byte              `json:"k"` // 'a'dmit, 'f'irst token, 'c'omplete
	ID    uuid.UUID         `json:"id"`
	Admit *router.Admission `json:"a,omitempty"`
}

type loadMsg struct {
	Replica uuid.UUID `json:"r"`
	Seq     uint64    `json:"s"` // the replica's messages, numbered from 1
	Ops     []loadOp  `json:"ops"`
}

// Share shares one replica's load with the others through a NATS
// connection. Route every request through Share's methods (not the
// router's), and give the router Share.OnAdmit as its Config.OnAdmit.
type Share struct {
	cfg  ShareConfig
	nc   *nats.Conn
	r    *router.Router
	self uuid.UUID
	sub  *nats.Subscription

	dropped atomic.Uint64 // messages and ops refused (see receive)

	mu      sync.Mutex
	pending []loadOp
	sent    uint64              // messages published
	remote  map[uuid.UUID]*peer // other replicas
	stop    chan struct{}
	done    sync.WaitGroup
}

type peer struct {
	seen  time.Time
	heard uint64 // the last message applied
	reqs  map[uuid.UUID]struct{}
}

// NewShare connects replica r to the others over the NATS server at url.
func NewShare(url string, r *router.Router, cfg ShareConfig) (*Share, error) {
	cfg.defaults()
	nc, err := nats.Connect(url, cfg.options(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))...)
	if err != nil {
		return nil, err
	}
	s := &Share{cfg: cfg, nc: nc, r: r, self: uuid.New(), remote: map[uuid.UUID]*peer{}, stop: make(chan struct{})}
	if s.sub, err = nc.Subscribe(cfg.Subject, s.receive); err != nil {
		nc.Close()
		return nil, err
	}
	// A round trip, so that the server has the subscription before
	// NewShare returns: updates sent from then on are heard.
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		nc.Close()
		return nil, fmt.Errorf("cluster: share on %s: %w", cfg.Subject, err)
	}
	s.done.Add(1)
	go s.loop()
	return s, nil
}

// OnAdmit is the router's Config.OnAdmit: it queues the admission.
func (s *Share) OnAdmit(id uuid.UUID, a router.Admission) {
	s.queue(loadOp{Kind: 'a', ID: id, Admit: &a})
}

// OnFirstToken marks the request's prefill done, here and on the others.
func (s *Share) OnFirstToken(id uuid.UUID) (bool, error) {
	s.queue(loadOp{Kind: 'f', ID: id})
	return s.r.OnFirstToken(id)
}

// OnComplete frees the request, here and on the others.
func (s *Share) OnComplete(id uuid.UUID) (bool, error) {
	s.queue(loadOp{Kind: 'c', ID: id})
	return s.r.OnComplete(id)
}

func (s *Share) queue(op loadOp) {
	s.mu.Lock()
	s.pending = append(s.pending, op)
	s.mu.Unlock()
}

// loop flushes the pending updates every cfg.Every (a heartbeat when there
// are none, every Timeout/4) and drops silent replicas' load.
func (s *Share) loop() {
	defer s.done.Done()
	tick := time.NewTicker(s.cfg.Every)
	defer tick.Stop()
	lastSent := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case now := <-tick.C:
			if s.flush(now.Sub(lastSent) >= s.cfg.Timeout/4) {
				lastSent = now
			}
			s.dropSilent(now)
		}
	}
}

// flush publishes the pending updates (or, with beat, an empty heartbeat);
// it reports whether it published.
func (s *Share) flush(beat bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 && !beat {
		return false
	}
	b, err := json.Marshal(loadMsg{Replica: s.self, Seq: s.sent + 1, Ops: s.pending})
	if err != nil || s.nc.Publish(s.cfg.Subject, b) != nil {
		return false
	}
	s.sent++
	s.pending = nil
	return true
}

// Flush publishes the pending updates now and returns the number of this
// replica's last message: another replica has seen everything up to now
// once its HeardFrom(ID()) reaches it.
func (s *Share) Flush() uint64 {
	s.flush(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// ID is this replica's id in its messages.
func (s *Share) ID() uuid.UUID { return s.self }

// HeardFrom returns the number of the last message applied from replica id.
func (s *Share) HeardFrom(id uuid.UUID) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.remote[id]; p != nil {
		return p.heard
	}
	return 0
}

// receive applies another replica's updates. A replica changes only the
// load it admitted itself: a first token or completion for a request that
// replica did not admit (this replica's own, say) is dropped, and so are
// admissions the router refuses (AdmitRemote: out of bounds), messages
// that do not decode and messages claiming this replica's id; each is
// counted (Dropped).
func (s *Share) receive(m *nats.Msg) {
	var msg loadMsg
	if json.Unmarshal(m.Data, &msg) != nil || msg.Replica == s.self || msg.Replica == uuid.Nil {
		s.dropped.Add(1)
		return
	}
	s.mu.Lock()
	p := s.remote[msg.Replica]
	if p == nil {
		p = &peer{reqs: map[uuid.UUID]struct{}{}}
		s.remote[msg.Replica] = p
	}
	p.seen = time.Now()
	s.mu.Unlock()
	for _, op := range msg.Ops {
		if !s.apply(p, op) {
			s.dropped.Add(1)
		}
	}
	s.mu.Lock()
	p.heard = max(p.heard, msg.Seq)
	s.mu.Unlock()
}

// apply applies one op of replica p; false if it is refused.
func (s *Share) apply(p *peer, op loadOp) bool {
	if op.Kind == 'a' {
		if op.Admit == nil || s.r.AdmitRemote(op.ID, *op.Admit) != nil {
			return false
		}
		s.mu.Lock()
		p.reqs[op.ID] = struct{}{}
		s.mu.Unlock()
		return true
	}
	s.mu.Lock()
	_, admitted := p.reqs[op.ID]
	if admitted && op.Kind == 'c' {
		delete(p.reqs, op.ID)
	}
	s.mu.Unlock()
	switch {
	case !admitted:
		return false
	case op.Kind == 'f':
		_, _ = s.r.OnFirstToken(op.ID)
	case op.Kind == 'c':
		_, _ = s.r.OnComplete(op.ID)
	default:
		return false
	}
	return true
}

// Dropped counts the load messages and operations refused: undecodable,
// claiming this replica, out of bounds, or about requests their sender
// did not admit.
func (s *Share) Dropped() uint64 { return s.dropped.Load() }

// dropSilent frees the load of replicas not heard from for Timeout.
func (s *Share) dropSilent(now time.Time) {
	var drop []uuid.UUID
	s.mu.Lock()
	for id, p := range s.remote {
		if now.Sub(p.seen) > s.cfg.Timeout {
			for req := range p.reqs {
				drop = append(drop, req)
			}
			delete(s.remote, id)
		}
	}
	s.mu.Unlock()
	for _, req := range drop {
		_, _ = s.r.OnComplete(req)
	}
}

// Replicas returns how many other replicas are being heard from.
func (s *Share) Replicas() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.remote)
}

// Close stops sharing (the others drop this replica's load after their
// Timeout) and closes the connection.
func (s *Share) Close() error {
	select {
	case <-s.stop:
		return errors.New("cluster: share closed twice")
	default:
	}
	close(s.stop)
	s.done.Wait()
	err := s.sub.Unsubscribe()
	s.nc.Close()
	return err
}
