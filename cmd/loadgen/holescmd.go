package main

import (
	"fmt"
	"io"

	"github.com/kvradix/kvradix/openloop"
	"github.com/kvradix/kvradix/shardpool"
)

type holesReport struct {
	Config  openloop.HolesConfig   `json:"config"`
	Results []openloop.HolesResult `json:"results"`
}

// runHoles runs the holes check (openloop.CheckHoles) on each indexer; a
// wrong lookup is an error.
func runHoles(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("holes", stderr)
	c := openloop.HolesConfig{}
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
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	impls, err := shardpool.ParseImpls(*compare, []int{2})
	if err != nil {
		return fmt.Errorf("-compare: %w", err)
	}
	rep := holesReport{Config: c}
	for _, im := range impls {
		rep.Results = append(rep.Results, openloop.CheckHoles(c, im))
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
