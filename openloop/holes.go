package openloop

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// The holes check (loadgen holes): workers store chains and then evict
// blocks in their middle while keeping the later ones (a hole), as
// engines do when a
// shared block's last reference goes before its children's; every lookup
// is checked against a naive model of what each worker holds. SMG found
// Dynamo's concurrent tree under-counting there (12 of 21,151 lookups
// wrong); kvradix's score stops at the first block a worker does not hold,
// the model's rule, and must never be wrong.

// HolesConfig is a holes corpus: chains stored by workers, holes made in
// them, lookups checked.
type HolesConfig struct {
	Workers  int     `json:"workers"`
	Chains   int     `json:"chains"`    // distinct chains, shared among workers
	Length   int     `json:"length"`    // blocks per chain
	Stores   int     `json:"stores"`    // chains stored
	HoleRate float64 `json:"hole_rate"` // share of a stored chain's blocks then removed from its middle
	Lookups  int     `json:"lookups"`
	Seed     uint64  `json:"seed"`
}

// HolesResult is one indexer's verdict on a holes corpus.
type HolesResult struct {
	Impl           string `json:"impl"`
	Lanes          int    `json:"lanes,omitempty"`
	Lookups        int    `json:"lookups"`
	WrongLookups   int    `json:"wrong_lookups"`
	LookupsInHoles int    `json:"lookups_past_a_hole"` // lookups whose chain had a hole before its end
	RejectedStores uint64 `json:"rejected_stores"`
	Holes          int    `json:"holes"`
	FirstWrong     string `json:"first_wrong,omitempty"`
}

// holesModel is what each worker holds, naively: its engine hashes' paths,
// and how many of its hashes name each path.
type holesModel struct {
	names map[kvevent.WorkerID]map[uint64]uint64
	held  map[kvevent.WorkerID]map[uint64]int
}

func (m *holesModel) apply(w kvevent.WorkerID, ev kvevent.Event) {
	if m.names[w] == nil {
		m.names[w], m.held[w] = map[uint64]uint64{}, map[uint64]int{}
	}
	names, held := m.names[w], m.held[w]
	switch d := ev.Data.(type) {
	case kvevent.Stored:
		path := uint64(0)
		if d.HasParent {
			path = names[d.ParentHash]
		}
		for _, b := range d.Blocks {
			path = holesChain(path, b.TokensHash)
			if old, ok := names[b.BlockHash]; ok {
				held[old]--
			}
			names[b.BlockHash] = path
			held[path]++
		}
	case kvevent.Removed:
		for _, h := range d.BlockHashes {
			if p, ok := names[h]; ok {
				delete(names, h)
				held[p]--
			}
		}
	}
}

// scoreAndBeyond returns how many leading blocks of q the worker holds,
// and whether it holds a block of q past the first it does not (q crosses
// a hole of its).
func (m *holesModel) scoreAndBeyond(w kvevent.WorkerID, q []uint64) (uint32, bool) {
	path, score, missing := uint64(0), uint32(len(q)), false
	for i, t := range q {
		path = holesChain(path, t)
		held := m.held[w][path] > 0
		switch {
		case !held && !missing:
			score, missing = uint32(i), true
		case held && missing:
			return score, true
		}
	}
	return score, false
}

func holesChain(path, tok uint64) uint64 {
	x := path*0x9E3779B97F4A7C15 ^ tok ^ 0x5851F42D4C957F2D
	x ^= x >> 33
	x *= 0xFF51AFD7ED558CCD
	return x ^ x>>29
}

// Validate names the first parameter out of range, by its loadgen flag.
func (c HolesConfig) Validate() error {
	switch {
	case c.Workers < 1 || c.Chains < 1 || c.Length < 3 || c.Stores < 1 || c.Lookups < 0:
		return errors.New("holes: -workers, -chains, -stores >= 1, -length >= 3, -lookups >= 0")
	case c.HoleRate < 0 || c.HoleRate >= 1:
		return fmt.Errorf("holes: -hole-rate %v, want in [0, 1)", c.HoleRate)
	}
	return nil
}

// CheckHoles stores the chains in a fresh indexer of im, makes the holes,
// then checks every lookup against the model.
func CheckHoles(c HolesConfig, im shardpool.Impl) HolesResult {
	r := rand.New(rand.NewPCG(c.Seed, 0x401e5))
	idx := im.New(16)
	defer idx.Close()
	m := &holesModel{names: map[kvevent.WorkerID]map[uint64]uint64{}, held: map[kvevent.WorkerID]map[uint64]int{}}
	tok := func(chain, j int) uint64 { return uint64(chain)<<32 | uint64(j) + 1 }
	res := HolesResult{Impl: im.Name, Lanes: im.Lanes}
	apply := func(w kvevent.WorkerID, ev kvevent.Event) {
		m.apply(w, ev)
		if idx.ApplyEvent(kvevent.RouterEvent{WorkerID: w, Event: ev}) != nil {
			res.RejectedStores++
		}
	}
	type stored struct {
		w      kvevent.WorkerID
		chain  int
		hashes []uint64
	}
	var all []stored
	next := uint64(1)
	for range c.Stores {
		s := stored{w: kvevent.WorkerID(r.IntN(c.Workers)), chain: r.IntN(c.Chains)}
		ev := kvevent.Stored{}
		for j := range c.Length {
			ev.Blocks = append(ev.Blocks, kvevent.StoredBlock{BlockHash: next, TokensHash: tok(s.chain, j)})
			s.hashes = append(s.hashes, next)
			next++
		}
		apply(s.w, kvevent.Event{ID: next, Data: ev})
		all = append(all, s)
	}
	for _, s := range all {
		var gone []uint64
		for j := 1; j < c.Length-1; j++ { // never the first or the last: a hole
			if r.Float64() < c.HoleRate {
				gone = append(gone, s.hashes[j])
			}
		}
		if len(gone) > 0 {
			res.Holes += len(gone)
			apply(s.w, kvevent.Event{ID: next, Data: kvevent.Removed{BlockHashes: gone}})
			next++
		}
	}
	if _, err := idx.Flush(); err != nil {
		res.FirstWrong = err.Error()
		res.WrongLookups = c.Lookups
		return res
	}
	for range c.Lookups {
		chain, n := r.IntN(c.Chains), 1+r.IntN(c.Length)
		q := make([]uint64, n)
		for j := range q {
			q[j] = tok(chain, j)
		}
		got, err := idx.FindMatches(q)
		res.Lookups++
		if err != nil {
			res.WrongLookups++
			continue
		}
		pastHole := false
		for w := range kvevent.WorkerID(c.Workers) {
			want, later := m.scoreAndBeyond(w, q)
			pastHole = pastHole || later
			if g := got.Scores[kvevent.Worker{ID: w}]; g != want {
				res.WrongLookups++
				if res.FirstWrong == "" {
					res.FirstWrong = fmt.Sprintf("worker %d on chain %d (%d blocks): %d, the model %d", w, chain, n, g, want)
				}
			}
		}
		if pastHole {
			res.LookupsInHoles++
		}
	}
	return res
}
