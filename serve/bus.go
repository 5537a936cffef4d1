package serve

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvradix/kvradix/cluster"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// On a bus (NewOnBus), replicas of the service serve the same indexes.
// Each (model, tenant) has a JetStream stream of its own (package cluster:
// events in order, duplicate ids dropped, snapshots in an object store),
// recording the model, tenant and block size in its metadata. An engine is
// registered with one replica: that replica subscribes to it and publishes
// its events to the model's stream, and every replica's index follows the
// stream (restored from the newest snapshot first, which the replicas
// write every SnapshotEvery). Every replica looks for new streams every
// second, so it serves a model as soon as any replica has registered an
// engine of it. The registry (GET /workers, -state) stays each replica's
// own: register an engine again with another replica if its own is gone.

// BusConfig configures the service's bus.
type BusConfig struct {
	URL  string       // the NATS server (an embedded server's URL carries its token)
	Auth cluster.Auth // credentials for a real cluster
	// SnapshotEvery is how often each index writes a snapshot of itself to
	// the bus, for replicas joining later (1m).
	SnapshotEvery time.Duration
	// Discover is how often the replica looks for the streams of models
	// it does not serve yet (1s).
	Discover time.Duration
	// MaxAge and MaxBytes bound each model's stream (0: no bound), oldest
	// events first; MaxAge must be at least MinStreamAge×SnapshotEvery, so
	// that a replica joining from the latest snapshot finds every event
	// after it.
	MaxAge   time.Duration
	MaxBytes int64
}

// defaults fills bc's zero intervals.
func (bc *BusConfig) defaults() {
	if bc.SnapshotEvery <= 0 {
		bc.SnapshotEvery = time.Minute
	}
	if bc.Discover <= 0 {
		bc.Discover = time.Second
	}
}

// Validate reports the stream bounds NewOnBus refuses, without reaching
// the bus: a negative MaxAge or MaxBytes, or a MaxAge shorter than
// MinStreamAge snapshot intervals.
func (bc BusConfig) Validate() error {
	bc.defaults()
	if bc.MaxAge < 0 || bc.MaxBytes < 0 || (bc.MaxAge > 0 && bc.MaxAge < MinStreamAge*bc.SnapshotEvery) {
		return fmt.Errorf("serve: bus: streams kept %v and %d bytes: want each 0 (no bound) or more, the age at least %d snapshot intervals (%v)",
			bc.MaxAge, bc.MaxBytes, MinStreamAge, MinStreamAge*bc.SnapshotEvery)
	}
	return nil
}

// MinStreamAge is how many snapshot intervals a bounded stream keeps at
// least (BusConfig.MaxAge).
const MinStreamAge = 10

// busSubjects is the subject every model's stream is under.
const busSubjects = "kvradix.>"

// Metadata keys of a model's stream.
const (
	metaModel     = "kvradix_model"
	metaTenant    = "kvradix_tenant"
	metaBlockSize = "kvradix_block_size"
)

type bus struct {
	cfg        BusConfig
	pools      poolConfig
	predictTTL time.Duration
	dir        *cluster.Directory
	life       context.Context // the service's: ends at Close
}

// NewOnBus returns an empty service whose indexes follow the NATS bus
// at cfg.URL (see above), serving at once the models other replicas
// have registered engines of.
func NewOnBus(cfg Config, bc BusConfig) (*Service, error) {
	if err := bc.Validate(); err != nil {
		return nil, err
	}
	bc.defaults()
	dir, err := cluster.OpenDirectory(bc.URL, bc.Auth)
	if err != nil {
		return nil, fmt.Errorf("serve: bus: %w", err)
	}
	s := New(cfg)
	s.bus = &bus{cfg: bc, pools: s.cfg.pools(), predictTTL: s.cfg.PredictTTL, dir: dir, life: s.ctx}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	if err := s.discover(ctx); err != nil {
		s.Close()
		return nil, err
	}
	s.bg.Go(s.discovering)
	return s, nil
}

// busConfig names model k's stream, subjects and snapshot bucket by a hash
// of the model and tenant (stream names take few characters).
func busConfig(k modelKey, blockSize int, auth cluster.Auth) cluster.Config {
	id := fmt.Sprintf("%016x", xxh3.HashString(k.model+"\x00"+k.tenant))
	return cluster.Config{Auth: auth, Stream: "KVRADIX_" + id, Subject: "kvradix." + id, Bucket: "KVRADIX_SNAP_" + id,
		Metadata: map[string]string{metaModel: k.model, metaTenant: k.tenant, metaBlockSize: strconv.Itoa(blockSize)}}
}

// join returns model k's index, following its stream (created if no
// replica has yet); a stream of another block size is a conflict.
func (b *bus) join(ctx context.Context, k modelKey, blockSize int) (*index, error) {
	ccfg := busConfig(k, blockSize, b.cfg.Auth)
	ccfg.MaxAge, ccfg.MaxBytes = b.cfg.MaxAge, b.cfg.MaxBytes
	streams, err := b.dir.Streams(ctx, ccfg.Subject+".>")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	for _, st := range streams {
		if bs := st.Metadata[metaBlockSize]; bs != strconv.Itoa(blockSize) {
			return nil, fmt.Errorf("%w: block_size %d, model %s:%s has %s on the bus", ErrConflict, blockSize, k.model, k.tenant, bs)
		}
	}
	bu, err := cluster.Connect(ctx, b.cfg.URL, ccfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	r, ix, err := bu.Join(ctx, func() shardpool.Indexer { return b.pools.newPool(blockSize) }, 30*time.Second)
	if err != nil {
		bu.Close()
		return nil, fmt.Errorf("serve: bus of %s:%s: %w", k.model, k.tenant, err)
	}
	pool := ix.(*shardpool.Pool)
	r.SnapshotEvery(b.life, pool.Index(), b.cfg.SnapshotEvery, nil)
	idx := indexOver(pool, blockSize, b.predictTTL)
	idx.bus, idx.replica = bu, r
	idx.sink = &busSink{bus: bu, replica: r, next: uint64(time.Now().UnixNano())}
	return idx, nil
}

// discovering joins the streams other replicas create, every
// BusConfig.Discover, until Close (the server away: the next tick tries
// again).
func (s *Service) discovering() {
	s.every(s.bus.cfg.Discover, 30*time.Second, func(ctx context.Context) { _ = s.discover(ctx) })
}

// discover joins the models' streams this replica does not follow yet.
func (s *Service) discover(ctx context.Context) error {
	streams, err := s.bus.dir.Streams(ctx, busSubjects)
	if err != nil {
		return fmt.Errorf("serve: bus: %w", err)
	}
	for _, st := range streams {
		k := modelKey{st.Metadata[metaModel], st.Metadata[metaTenant]}
		bs, err := strconv.Atoi(st.Metadata[metaBlockSize])
		if k.model == "" || err != nil || bs <= 0 {
			continue // not a model's stream
		}
		if err := s.follow(ctx, k, bs); err != nil {
			return err
		}
	}
	return nil
}

// follow serves model k from its stream, unless it does already.
func (s *Service) follow(ctx context.Context, k modelKey, blockSize int) error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	s.mu.Lock()
	known, closed := s.indexes[k] != nil, s.closed
	s.mu.Unlock()
	if known || closed {
		return nil
	}
	idx, err := s.bus.join(ctx, k, blockSize)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.indexes[k] = idx
	s.mu.Unlock()
	return nil
}

// busSink publishes a model's events to its stream: the subscribers of the
// engines registered here write to it. Each event gets an id of the sink's
// own (from the clock at its start, then counting), so that the bus's
// duplicate window drops only re-sends, never a restarted engine's events
// numbered again from zero.
type busSink struct {
	bus     *cluster.Bus
	replica *cluster.Replica
	mu      sync.Mutex
	next    uint64
}

// ApplyEvent publishes ev and waits for the bus to store it.
func (b *busSink) ApplyEvent(ev kvevent.RouterEvent) error {
	b.mu.Lock()
	ev.Event.ID = b.next
	b.next++
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := b.bus.Publish(ctx, ev)
	return err
}

// Flush returns once this replica's index has applied every event the
// stream holds.
func (b *busSink) Flush() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.replica.CatchUp(ctx); err != nil {
		return 0, err
	}
	return 0, nil
}
