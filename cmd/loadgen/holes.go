package main

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// The holes check: workers store chains and then evict blocks in their
// middle while keeping the later ones (a hole), as engines do when a
// shared block's last reference goes before its children's; every lookup
// is checked against a naive model of what each worker holds. SMG found
// Dynamo's concurrent tree under-counting there (12 of 21,151 lookups
// wrong); kvradix's score stops at the first block a worker does not hold,
// the model's rule, and must never be wrong.

type holesConfig struct {
	Workers  int     `json:"workers"`
	Chains   int     `json:"chains"`    // distinct chains, shared among workers
	Length   int     `json:"length"`    // blocks per chain
	Stores   int     `json:"stores"`    // chains stored
	HoleRate float64 `json:"hole_rate"` // share of a stored chain's blocks then removed from its middle
	Lookups  int     `json:"lookups"`
	Seed     uint64  `json:"seed"`
}

type holesResult struct {
	Impl           string `json:"impl"`
	Lanes          int    `json:"lanes,omitempty"`
	Lookups        int    `json:"lookups"`
	WrongLookups   int    `json:"wrong_lookups"`
	LookupsInHoles int    `json:"lookups_past_a_hole"` // lookups whose chain had a hole before its end
	RejectedStores uint64 `json:"rejected_stores"`
	Holes          int    `json:"holes"`
	FirstWrong     string `json:"first_wrong,omitempty"`
}

type holesReport struct {
	Config  holesConfig   `json:"config"`
	Results []holesResult `json:"results"`
}

func runHoles(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("holes", stderr)
	c := holesConfig{}
	fs.IntVar(&c.Workers, "workers", 16, "workers")
	fs.IntVar(&c.Chains, "chains", 500, "distinct chains, shared among workers")
	fs.IntVar(&c.Length, "length", 48, "blocks per chain")
	fs.IntVar(&c.Stores, "stores", 4000, "chains stored (each by a worker)")
	fs.Float64Var(&c.HoleRate, "hole-rate", 0.05, "share of each stored chain's blocks then removed from its middle")
	fs.IntVar(&c.Lookups, "lookups", 20000, "lookups, each checked against the model")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed")
	compare := fs.String("compare", "single,pool,compressed", "indexers")
	var out output
	out.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("holes: unexpected argument %q", fs.Arg(0))
	case c.Workers < 1 || c.Chains < 1 || c.Length < 3 || c.Stores < 1 || c.Lookups < 0:
		return errors.New("holes: -workers, -chains, -stores >= 1, -length >= 3, -lookups >= 0")
	case c.HoleRate < 0 || c.HoleRate >= 1:
		return fmt.Errorf("holes: -hole-rate %v, want in [0, 1)", c.HoleRate)
	}
	if err := out.validate(); err != nil {
		return err
	}
	impls, err := shardpool.ParseImpls(*compare, []int{2})
	if err != nil {
		return err
	}
	rep := holesReport{Config: c}
	for _, im := range impls {
		rep.Results = append(rep.Results, c.check(im))
	}
	err = out.write(stdout, rep, func() {
		fmt.Fprintf(stdout, "%d workers, %d chains of %d blocks, %d stores, hole rate %.2f\n", c.Workers, c.Chains, c.Length, c.Stores, c.HoleRate)
		for _, r := range rep.Results {
			fmt.Fprintf(stdout, "%-12s lookups %d (%d past a hole), wrong %d, holes %d, rejected stores %d %s\n",
				shardpool.Impl{Name: r.Impl, Lanes: r.Lanes}, r.Lookups, r.LookupsInHoles, r.WrongLookups, r.Holes, r.RejectedStores, r.FirstWrong)
		}
	}, func() {})
	if err != nil {
		return err
	}
	for _, r := range rep.Results {
		if r.WrongLookups > 0 {
			return fmt.Errorf("holes: %s answered %d lookups wrong", r.Impl, r.WrongLookups)
		}
	}
	return nil
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

// check stores the chains, makes the holes, then checks every lookup.
func (c holesConfig) check(im shardpool.Impl) holesResult {
	r := rand.New(rand.NewPCG(c.Seed, 0x401e5))
	idx := im.New(16)
	defer idx.Close()
	m := &holesModel{names: map[kvevent.WorkerID]map[uint64]uint64{}, held: map[kvevent.WorkerID]map[uint64]int{}}
	tok := func(chain, j int) uint64 { return uint64(chain)<<32 | uint64(j) + 1 }
	res := holesResult{Impl: im.Name, Lanes: im.Lanes}
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
