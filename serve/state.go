package serve

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvradix/kvradix/cluster"
)

// The state directory (Config.StateDir) holds stateFile, the registry and
// where each engine's stream stood, and one snapshot per index in the
// cluster package's checked format. It is written on Close and every
// Config.SaveEvery (Save), and read by Recover. Each save is a generation:
// its snapshots are new files named by it, each written atomically (a
// temporary file, fsync, rename, fsync of the directory), then stateFile is
// replaced the same way, and only then are the previous generation's files
// removed. A crash at any point leaves a stateFile naming one whole
// generation.
//
// stateFile is checked whole: its checksum is the SHA-256 of the file
// written with an empty checksum, and it names each snapshot's SHA-256, so
// a flipped byte anywhere, or two snapshots swapped, is refused rather than
// loaded as another model, tenant, instance or resume point. A refused
// state is moved aside (setAside) before anything can overwrite it.
const (
	stateFile    = "state.json"
	stateVersion = 2 // 1: before checksums, still read
)

type savedState struct {
	Version    int             `json:"version"`
	Generation uint64          `json:"generation"`
	Indexes    []savedIndex    `json:"indexes"`
	Instances  []savedInstance `json:"instances"`
	Checksum   string          `json:"checksum,omitempty"` // version 2
}

type savedIndex struct {
	Model     string `json:"model_name"`
	Tenant    string `json:"tenant_id"`
	BlockSize int    `json:"block_size"`
	File      string `json:"file"`
	SHA256    string `json:"sha256,omitempty"` // of File; version 2
}

// sealed returns st as stateFile holds it: with its checksum.
func sealed(st savedState) ([]byte, error) {
	st.Checksum = ""
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, err
	}
	st.Checksum = digest(data)
	return json.MarshalIndent(st, "", "  ")
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// readState reads and checks stateFile: (nil, nil) if there is none.
func (s *Service) readState() (*savedState, error) {
	data, err := os.ReadFile(filepath.Join(s.cfg.StateDir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("serve: state: %w", err)
	}
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("serve: state %s: %w", stateFile, err)
	}
	switch {
	case st.Version == 1 && st.Checksum == "":
		// Written before checksums: read as it is.
	case st.Version != stateVersion:
		return nil, fmt.Errorf("serve: state %s: version %d, this reads %d", stateFile, st.Version, stateVersion)
	default:
		again, err := sealed(st)
		if err != nil || !bytes.Equal(again, data) {
			return nil, fmt.Errorf("serve: state %s: checksum mismatch: the file is corrupt", stateFile)
		}
	}
	return &st, nil
}

// setAside moves stateFile and the snapshots into a new directory of
// StateDir's, which saves never touch, and returns it ("" if there was
// nothing to move).
func (s *Service) setAside() (string, error) {
	dir := filepath.Join(s.cfg.StateDir, fmt.Sprintf("refused-%d", time.Now().UnixNano()))
	entries, err := os.ReadDir(s.cfg.StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	moved := ""
	for _, e := range entries {
		name := e.Name()
		if name != stateFile && !strings.HasPrefix(name, "index-") {
			continue
		}
		if moved == "" {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return "", err
			}
			moved = dir
		}
		if err := os.Rename(filepath.Join(s.cfg.StateDir, name), filepath.Join(dir, name)); err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// refuse sets the state aside and returns why it was refused, and where
// it went.
func (s *Service) refuse(why error) error {
	switch dir, err := s.setAside(); {
	case err != nil:
		return fmt.Errorf("%w (setting its files aside failed: %v)", why, err)
	case dir != "":
		return fmt.Errorf("%w; its files are kept in %s", why, dir)
	}
	return why
}

type savedInstance struct {
	Registration
	ResumeAt uint64 `json:"resume_at"` // the engine's first batch not applied
}

// Recovered is what Recover brought back.
type Recovered struct {
	Indexes   int // indexes restored from their snapshots
	Pairs     int // (instance, block) pairs in them
	Instances int // engines subscribed again, resuming where they stood
	// Failed names what was not recovered: engines whose registration
	// was refused, and the peers' errors when no peer's dump could be
	// read.
	Failed []string
	// Peer is the peer the indexes were restored from (Config.Peers: a
	// service with no saved state to recover), PeerEvents its events.
	Peer       string
	PeerEvents int
}

// Recover restores the state Close saved in Config.StateDir: every index
// from its snapshot, then every engine's subscription, resuming at the
// first batch it had not applied (its subscriber repairs the rest from the
// engine's ring; an engine that no longer holds that far back has its
// blocks cleared, counted in the subscriber's ResumesCleared). No state is
// no error. A state that does not check out whole (unreadable, corrupt,
// truncated, another version, a snapshot of another block size) is refused
// with an error saying why, and the service stays empty.
//
// A service with no saved state to recover restores its indexes from its
// peers instead (Config.Peers); Close, or the end of ctx (RecoverContext),
// abandons that: the service stays empty, the failure listed.
func (s *Service) Recover() (Recovered, error) { return s.RecoverContext(context.Background()) }

// RecoverContext is Recover, the recovery from peers abandoned when ctx
// ends (a peer may take minutes to answer, or never).
func (s *Service) RecoverContext(ctx context.Context) (Recovered, error) {
	defer s.recovering.Store(false)
	rec, err := s.recoverState()
	if err != nil || rec.Indexes > 0 || len(s.Peers()) == 0 {
		return rec, err
	}
	if s.bus != nil {
		rec.Failed = append(rec.Failed, "peers: not on a bus (the bus is the replication)")
		return rec, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	peer, n, perr := s.recoverFromPeers(ctx)
	if perr != nil {
		rec.Failed = append(rec.Failed, fmt.Sprintf("recovery from peers: %v", perr))
		return rec, nil
	}
	rec.Peer, rec.PeerEvents = peer, n
	return rec, nil
}

// recoverState is Recover's part from Config.StateDir.
func (s *Service) recoverState() (Recovered, error) {
	var rec Recovered
	if s.cfg.StateDir == "" {
		return rec, nil
	}
	st, err := s.readState()
	if err != nil {
		return rec, s.refuse(err)
	}
	if st == nil {
		// Snapshots whose registry is gone cannot be told apart: starting
		// empty is right, silently is not.
		if orphans, _ := filepath.Glob(filepath.Join(s.cfg.StateDir, "index-*")); len(orphans) > 0 {
			return rec, s.refuse(fmt.Errorf("serve: %d snapshots without a %s (no registry to say whose they are): starting empty", len(orphans), stateFile))
		}
		return rec, nil
	}
	if s.bus != nil && len(st.Indexes) > 0 {
		return rec, fmt.Errorf("serve: state %s holds indexes saved off the bus: start without the bus, or without the state", stateFile)
	}
	indexes := map[modelKey]*index{}
	closeAll := func() {
		for _, idx := range indexes {
			idx.close()
		}
	}
	pools := savedPools(st.Instances)
	for _, si := range st.Indexes {
		idx, err := s.loadIndex(si, st.Version, pools[modelKey{si.Model, si.Tenant}])
		if err != nil {
			closeAll()
			return Recovered{}, s.refuse(err)
		}
		indexes[modelKey{si.Model, si.Tenant}] = idx
		rec.Indexes++
		rec.Pairs += idx.pool.Index().Size()
	}
	s.regMu.Lock()
	s.mu.Lock()
	for k, idx := range indexes {
		s.indexes[k] = idx
	}
	s.gen = st.Generation
	s.mu.Unlock()
	s.regMu.Unlock()
	for _, inst := range st.Instances {
		if err := s.subscribe(inst.Registration, inst.ResumeAt); err != nil {
			rec.Failed = append(rec.Failed, fmt.Sprintf("instance %d rank %d of %s: %v", inst.InstanceID, inst.DPRank, inst.ModelName, err))
			continue
		}
		rec.Instances++
	}
	return rec, nil
}

// savedPools sums, by model, the KV pools (total_kv_blocks) of the saved
// instances that publish events: their indexes are made sized for them
// before their snapshots load, rather than resized, every entry moved, as
// each engine registers again (see index.reserve).
func savedPools(insts []savedInstance) map[modelKey]int {
	pools := map[modelKey]int{}
	for _, in := range insts {
		if in.Endpoint != "" {
			pools[modelKey{in.ModelName, in.TenantID}] += in.TotalKVBlocks
		}
	}
	return pools
}

// loadIndex restores one index from its checked snapshot, which must be
// the one the state names (version 2: its SHA-256), sized first for
// blocks if more than Config.IndexBlocks (see savedPools).
func (s *Service) loadIndex(si savedIndex, version, blocks int) (*index, error) {
	data, err := os.ReadFile(filepath.Join(s.cfg.StateDir, filepath.Base(si.File)))
	if err != nil {
		return nil, fmt.Errorf("serve: state of %s:%s: %w", si.Model, si.Tenant, err)
	}
	if version >= 2 && digest(data) != si.SHA256 {
		return nil, fmt.Errorf("serve: state of %s:%s: %s is corrupt, or not the snapshot the state names (its SHA-256 differs)", si.Model, si.Tenant, si.File)
	}
	pool := s.cfg.pools().sizedFor(blocks).newPool(si.BlockSize)
	_, bs, err := cluster.DecodeSnapshot(data, pool.ApplyEvent)
	if err == nil && bs != si.BlockSize {
		err = fmt.Errorf("block size %d, the state says %d", bs, si.BlockSize)
	}
	if err == nil {
		_, err = pool.Flush()
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("serve: state of %s:%s (%s): %w", si.Model, si.Tenant, si.File, err)
	}
	return indexOver(pool, si.BlockSize, s.cfg.PredictTTL), nil
}

// Save writes the state to Config.StateDir now, while the service goes on
// serving. Each index is cut in turn: its engines' subscribers are paused
// between two batches (see vllm.Subscriber.Pause) while it is flushed and
// encoded, so that the index and its engines' positions are one
// consistent cut; queries go on meanwhile, and the engines' events wait in
// the subscribers' queues. The files are written after every subscriber is
// going again. Registrations wait for a save. If ctx ends before an
// index's subscribers have paused (one repairing a gap, say), nothing is
// written.
func (s *Service) Save(ctx context.Context) (err error) {
	if s.cfg.StateDir == "" {
		return errors.New("serve: no state directory")
	}
	s.regMu.Lock()
	defer s.regMu.Unlock()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return errors.New("serve: service closed") // Close saves
	}
	defer s.metrics.observeSave(time.Now(), &err)
	snaps := map[modelKey][]byte{}
	resumeAt := map[instanceKey]uint64{}
	for k, idx := range s.indexes {
		snap, err := s.cut(ctx, k, idx, resumeAt)
		if err != nil {
			return err
		}
		snaps[k] = snap
	}
	return s.write(snaps, resumeAt)
}

// cut pauses the subscribers of index k, records their positions in
// resumeAt, and encodes the index, flushed (regMu held).
func (s *Service) cut(ctx context.Context, k modelKey, idx *index, resumeAt map[instanceKey]uint64) ([]byte, error) {
	for ik, inst := range s.instances {
		if ik.modelKey != k || inst.sub == nil {
			continue
		}
		resume, err := inst.sub.Pause(ctx)
		if err != nil {
			return nil, fmt.Errorf("serve: state: pausing instance %d rank %d of %s:%s: %w", ik.instance, ik.rank, k.model, k.tenant, err)
		}
		defer resume()
		resumeAt[ik] = resumePoint(inst)
	}
	return encodeIndex(idx)
}

// encodeIndex flushes an index and returns its snapshot (none for an
// index on a bus: the bus keeps its snapshots).
func encodeIndex(idx *index) ([]byte, error) {
	if idx.bus != nil {
		return nil, nil
	}
	if _, err := idx.pool.Flush(); err != nil {
		return nil, err
	}
	return cluster.EncodeSnapshot(idx.pool.Index(), 0, idx.blockSize), nil
}

// saveEvery saves the state every Config.SaveEvery until Close.
func (s *Service) saveEvery() {
	s.every(s.cfg.SaveEvery, max(s.cfg.SaveEvery, 10*time.Second), func(ctx context.Context) {
		if err := s.Save(ctx); err != nil && s.ctx.Err() == nil && s.cfg.OnSaveError != nil {
			s.cfg.OnSaveError(err)
		}
	})
}

// every calls f every interval, each call given at most limit, until
// Close.
func (s *Service) every(interval, limit time.Duration, f func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(s.ctx, limit)
			f(ctx)
			cancel()
		}
	}
}

// write writes a new generation of the state: the snapshots of the
// indexes, then the registry with each engine's position, then removes the
// files of the others (regMu held).
func (s *Service) write(snaps map[modelKey][]byte, resumeAt map[instanceKey]uint64) error {
	if err := os.MkdirAll(s.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("serve: state: %w", err)
	}
	st := savedState{Version: stateVersion, Generation: s.gen + 1}
	keep := map[string]bool{stateFile: true}
	for k, snap := range snaps {
		if snap == nil {
			continue
		}
		file := fmt.Sprintf("index-g%d-%d.snap", st.Generation, len(st.Indexes))
		if err := writeAtomic(s.cfg.StateDir, file, snap); err != nil {
			return err
		}
		keep[file] = true
		st.Indexes = append(st.Indexes, savedIndex{Model: k.model, Tenant: k.tenant, BlockSize: s.indexes[k].blockSize, File: file, SHA256: digest(snap)})
	}
	for k, inst := range s.instances {
		st.Instances = append(st.Instances, savedInstance{Registration: inst.reg, ResumeAt: resumeAt[k]})
	}
	for _, d := range s.pending { // registered, not reached yet: dialled again after a restart
		st.Instances = append(st.Instances, savedInstance{Registration: d.reg, ResumeAt: d.resumeAt})
	}
	data, err := sealed(st)
	if err != nil {
		return err
	}
	if err := writeAtomic(s.cfg.StateDir, stateFile, data); err != nil {
		return err
	}
	s.gen = st.Generation
	removeOthers(s.cfg.StateDir, keep)
	return nil
}

// removeOthers removes the snapshots and temporary files of other
// generations from dir (best effort: a file left is only space).
func removeOthers(dir string, keep map[string]bool) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		name := e.Name()
		if !keep[name] && (strings.HasPrefix(name, "index-") || strings.HasPrefix(name, stateFile+".tmp-")) {
			os.Remove(filepath.Join(dir, name))
		}
	}
}

// writeAtomic replaces dir/name with data: a temporary file, fsync,
// rename, fsync of the directory. A reader sees the old file or the new.
func writeAtomic(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, name+".tmp-*")
	if err != nil {
		return fmt.Errorf("serve: state: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("serve: state %s: %w", name, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// resumePoint is where an engine's stream stands once its subscriber is
// closed: the first batch not applied.
func resumePoint(inst *instance) uint64 {
	if inst.sub == nil {
		return 0
	}
	if r := inst.sub.Received(); len(r) > 0 {
		return r[0]
	}
	return 0
}
