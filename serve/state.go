package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kvradix/kvradix/cluster"
	"github.com/kvradix/kvradix/shardpool"
)

// The state directory (Config.StateDir) holds stateFile, the registry and
// where each engine's stream stood, and one snapshot per index in the
// cluster package's checked format. It is written on Close, each file
// atomically (a temporary file, fsync, rename, fsync of the directory), and
// read by Recover.
const (
	stateFile    = "state.json"
	stateVersion = 1
)

type savedState struct {
	Version   int             `json:"version"`
	Indexes   []savedIndex    `json:"indexes"`
	Instances []savedInstance `json:"instances"`
}

type savedIndex struct {
	Model     string `json:"model_name"`
	Tenant    string `json:"tenant_id"`
	BlockSize int    `json:"block_size"`
	File      string `json:"file"`
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
	// Failed names the engines that could not be subscribed again: their
	// blocks stay in the index until they are registered again or
	// unregistered.
	Failed []string
}

// Recover restores the state Close saved in Config.StateDir: every index
// from its snapshot, then every engine's subscription, resuming at the
// first batch it had not applied (its subscriber repairs the rest from the
// engine's ring; an engine that no longer holds that far back has its
// blocks cleared, counted in the subscriber's ResumesCleared). No state is
// no error. A state that does not check out whole (unreadable, corrupt,
// truncated, another version, a snapshot of another block size) is refused
// with an error saying why, and the service stays empty.
func (s *Service) Recover() (Recovered, error) {
	var rec Recovered
	if s.cfg.StateDir == "" {
		return rec, nil
	}
	data, err := os.ReadFile(filepath.Join(s.cfg.StateDir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return rec, nil
	}
	if err != nil {
		return rec, fmt.Errorf("serve: state: %w", err)
	}
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		return rec, fmt.Errorf("serve: state %s: %w", stateFile, err)
	}
	if st.Version != stateVersion {
		return rec, fmt.Errorf("serve: state %s: version %d, this reads %d", stateFile, st.Version, stateVersion)
	}
	indexes := map[modelKey]*index{}
	closeAll := func() {
		for _, idx := range indexes {
			idx.pool.Close()
		}
	}
	for _, si := range st.Indexes {
		idx, err := s.loadIndex(si)
		if err != nil {
			closeAll()
			return Recovered{}, err
		}
		indexes[modelKey{si.Model, si.Tenant}] = idx
		rec.Indexes++
		rec.Pairs += idx.pool.Index().Size()
	}
	s.mu.Lock()
	for k, idx := range indexes {
		s.indexes[k] = idx
	}
	s.mu.Unlock()
	for _, inst := range st.Instances {
		if err := s.subscribe(inst.Registration, inst.ResumeAt); err != nil {
			rec.Failed = append(rec.Failed, fmt.Sprintf("instance %d rank %d of %s: %v", inst.InstanceID, inst.DPRank, inst.ModelName, err))
			continue
		}
		rec.Instances++
	}
	return rec, nil
}

// loadIndex restores one index from its checked snapshot.
func (s *Service) loadIndex(si savedIndex) (*index, error) {
	data, err := os.ReadFile(filepath.Join(s.cfg.StateDir, filepath.Base(si.File)))
	if err != nil {
		return nil, fmt.Errorf("serve: state of %s:%s: %w", si.Model, si.Tenant, err)
	}
	pool := shardpool.NewPool(s.cfg.Lanes, si.BlockSize)
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
	return indexOver(pool, si.BlockSize), nil
}

// save writes the state (s.mu held, the subscribers closed, so that each
// index and each engine's position agree).
func (s *Service) save(resumeAt map[instanceKey]uint64) error {
	if err := os.MkdirAll(s.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("serve: state: %w", err)
	}
	st := savedState{Version: stateVersion}
	n := 0
	for k, idx := range s.indexes {
		if _, err := idx.pool.Flush(); err != nil {
			return err
		}
		file := fmt.Sprintf("index-%d.snap", n)
		n++
		if err := writeAtomic(s.cfg.StateDir, file, cluster.EncodeSnapshot(idx.pool.Index(), 0, idx.blockSize)); err != nil {
			return err
		}
		st.Indexes = append(st.Indexes, savedIndex{Model: k.model, Tenant: k.tenant, BlockSize: idx.blockSize, File: file})
	}
	for k, inst := range s.instances {
		st.Instances = append(st.Instances, savedInstance{Registration: inst.reg, ResumeAt: resumeAt[k]})
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(s.cfg.StateDir, stateFile, data)
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
	if r := inst.sub.Received(); len(r) > 0 {
		return r[0]
	}
	return 0
}
