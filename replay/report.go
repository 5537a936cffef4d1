package replay

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/trace"
)

// Report is a comparison of routers on one trace and fleet, with the
// reference reuses every router is measured against (see References).
type Report struct {
	Trace     string  `json:"trace"`
	Workers   int     `json:"workers"`
	Blocks    int     `json:"blocks"`
	BlockSize int     `json:"block_size"`
	Speedup   float64 `json:"speedup"`
	Seed      uint64  `json:"seed"`
	Offload   float64 `json:"offload,omitempty"` // host tier per engine, in device pools
	// The approximate routers' settings (Config), and the replicas.
	ApproxCapacity float64  `json:"approx_capacity"`
	ApproxTTLSec   float64  `json:"approx_ttl_s,omitempty"` // 0: the default
	PredictTTLSec  float64  `json:"predict_ttl_s,omitempty"`
	Replicas       int      `json:"replicas"`
	Isolated       bool     `json:"isolated,omitempty"`
	ReusePooled    float64  `json:"reuse_pooled"`
	ReuseUnbounded float64  `json:"reuse_unbounded"`
	Results        []Result `json:"results"`
}

// Compare replays reqs once per router, side by side, computes the
// references and each result's RoutingEfficiency. If ctx ends, it returns
// ctx's error with the results finished by then (the others keep only
// their Router name).
func Compare(ctx context.Context, reqs []trace.Request, routers []string, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	p := startPrompts(ctx, reqs, cfg)
	defer p.close()
	return compare(ctx, reqs, p, routers, cfg, runtime.GOMAXPROCS(0))
}

// compare is Compare over prompts hashed once, running at most n replays
// (and the references) at a time.
func compare(ctx context.Context, reqs []trace.Request, p *prompts, routers []string, cfg Config, n int) (Report, error) {
	rep := newReport(cfg, routers)
	if err := parallel(rep.jobs(ctx, reqs, p, cfg), n, nil); err != nil {
		return rep, err
	}
	rep.setEfficiencies()
	return rep, nil
}

// newReport is an empty report of cfg's fleet for the routers.
func newReport(cfg Config, routers []string) Report {
	rep := Report{Workers: cfg.Workers, Blocks: cfg.Blocks, BlockSize: cfg.BlockSize, Speedup: cfg.Speedup, Seed: cfg.Seed,
		Offload: cfg.Offload, ApproxCapacity: cfg.ApproxCapacity, ApproxTTLSec: cfg.ApproxTTL.Seconds(), PredictTTLSec: cfg.PredictTTL.Seconds(),
		Replicas: cfg.Replicas, Isolated: cfg.Isolated, Results: make([]Result, len(routers))}
	for i, name := range routers {
		rep.Results[i].Router = name
	}
	return rep
}

// jobs returns the replays that fill the report: the references, and one
// per router of its Results.
func (rep *Report) jobs(ctx context.Context, reqs []trace.Request, p *prompts, cfg Config) []func() error {
	jobs := []func() error{func() (err error) {
		rep.ReusePooled, rep.ReuseUnbounded, err = references(ctx, reqs, p, cfg)
		return err
	}}
	for i := range rep.Results {
		name := rep.Results[i].Router
		jobs = append(jobs, func() error {
			res, err := runPrompts(ctx, reqs, p, name, cfg)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			rep.Results[i] = res
			return nil
		})
	}
	return jobs
}

// setEfficiencies sets every result's efficiency against the references.
func (rep *Report) setEfficiencies() {
	for i := range rep.Results {
		rep.Results[i].setEfficiency(rep.ReusePooled)
	}
}

func (r *Result) setEfficiency(pooled float64) {
	if pooled > 0 {
		r.RoutingEfficiency = r.ReuseRatio / pooled
	}
}

// parallel runs jobs, at most n at a time, and returns the first error in
// job order. done, if not nil, hears how many jobs have finished after
// each one (from one goroutine at a time).
func parallel(jobs []func() error, n int, done func(finished, total int)) error {
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, max(n, 1))
	var wg sync.WaitGroup
	var mu sync.Mutex
	finished := 0
	for i, job := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = job()
			if done != nil {
				mu.Lock()
				finished++
				done(finished, len(jobs))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Sweep settings: the KV router knobs a sweep may vary.
const (
	SetOverlapWeight  = "overlap_weight"
	SetTemperature    = "temperature"
	SetQueueThreshold = "queue_threshold"
	// SetHostWeight is kv_tiers' weight of a host block (Config.TierWeights,
	// the other tiers at their defaults); sweeping it sweeps kv_tiers.
	SetHostWeight = "host_weight"
	// SetApproxCapacity is kv_approx_lru's capacity as a multiple of the
	// engines' true blocks (Config.ApproxCapacity); sweeping it sweeps
	// kv_approx_lru.
	SetApproxCapacity = "approx_capacity"
	// SetApproxTTL is kv_approx_ttl's lifetime in seconds (Config.ApproxTTL);
	// sweeping it sweeps kv_approx_ttl.
	SetApproxTTL = "approx_ttl"
	// SetPredictTTL is kv_predict's lifetime in seconds (Config.PredictTTL);
	// sweeping it sweeps kv_predict.
	SetPredictTTL = "predict_ttl"
)

// setRouters names the router a sweep of a setting runs (kv otherwise).
var setRouters = map[string]string{SetTemperature: KVTemp, SetHostWeight: KVTiers, SetApproxCapacity: KVApproxLRU, SetApproxTTL: KVApproxTTL, SetPredictTTL: KVPredict}

// setNames lists the settings a sweep may vary.
var setNames = []string{SetOverlapWeight, SetTemperature, SetQueueThreshold, SetHostWeight, SetApproxCapacity, SetApproxTTL, SetPredictTTL}

// Setting is one swept knob and its values.
type Setting struct {
	Name   string
	Values []float64
}

// ParseSetting parses "name=v1,v2,...", name one of overlap_weight,
// temperature, queue_threshold, host_weight, approx_capacity, approx_ttl,
// predict_ttl.
func ParseSetting(s string) (Setting, error) {
	name, list, ok := strings.Cut(s, "=")
	if !ok || list == "" {
		return Setting{}, fmt.Errorf("sweep %q: want name=v1,v2 (a comma list of values)", s)
	}
	if !slices.Contains(setNames, name) {
		return Setting{}, fmt.Errorf("sweep: unknown setting %q (want one of %s)", name, strings.Join(setNames, ", "))
	}
	set := Setting{Name: name}
	for _, f := range strings.Split(list, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return Setting{}, fmt.Errorf("sweep %s: value %q, want a finite number >= 0", name, f)
		}
		set.Values = append(set.Values, v)
	}
	return set, nil
}

// with returns cfg with the named knob set to v.
func (c Config) with(name string, v float64) (Config, error) {
	switch name {
	case SetOverlapWeight:
		c.OverlapWeight = v
	case SetTemperature:
		c.Temperature = v
	case SetQueueThreshold:
		c.QueueThreshold = v
	case SetHostWeight:
		if c.TierWeights == ([kvevent.NumTiers]float64{}) {
			c.TierWeights = router.DefaultTierWeights
		}
		c.TierWeights[kvevent.TierHostPinned] = v
	case SetApproxCapacity:
		if v == 0 {
			return c, fmt.Errorf("sweep: %s 0: want > 0", name)
		}
		c.ApproxCapacity = v
	case SetApproxTTL:
		c.ApproxTTL = seconds(v)
	case SetPredictTTL:
		c.PredictTTL = seconds(v)
	}
	return c, nil
}

// seconds is v seconds, at least a nanosecond (0 would mean the default).
func seconds(v float64) time.Duration {
	return max(time.Duration(v*float64(time.Second)), 1)
}

// SweepPoint is one setting of the swept knobs and the KV router's replay
// under it.
type SweepPoint struct {
	Settings map[string]float64 `json:"settings"`
	Result
}

// SweepReport is a sweep: the references and one point per combination.
type SweepReport struct {
	Report
	Points []SweepPoint `json:"sweep"`
}

// Sweep replays the KV router once per combination of the settings' values
// (their cartesian product, the first setting varying slowest), the other
// knobs as in cfg. The router is kv_temp when temperature is swept,
// kv_tiers when host_weight is, kv_approx_lru, kv_approx_ttl or kv_predict
// when their setting is, else kv.
// The report's Results hold the round-robin and default KV baselines. If
// ctx ends, it returns ctx's error with the points finished by then (the
// others keep only their settings).
func Sweep(ctx context.Context, reqs []trace.Request, settings []Setting, cfg Config) (SweepReport, error) {
	return SweepProgress(ctx, reqs, settings, cfg, nil)
}

// SweepProgress is Sweep, calling progress (if not nil) after each replay
// it finishes, with the number finished and the total (the two baselines
// and the references included).
func SweepProgress(ctx context.Context, reqs []trace.Request, settings []Setting, cfg Config, progress func(done, total int)) (SweepReport, error) {
	if err := cfg.Validate(); err != nil {
		return SweepReport{}, err
	}
	p := startPrompts(ctx, reqs, cfg)
	defer p.close()
	return sweep(ctx, reqs, p, settings, cfg, runtime.GOMAXPROCS(0), progress)
}

// sweep is SweepProgress over prompts hashed once, at most n replays at a
// time: the baselines, the references and every point in one pool.
func sweep(ctx context.Context, reqs []trace.Request, p *prompts, settings []Setting, cfg Config, n int, progress func(done, total int)) (SweepReport, error) {
	routerName := KV
	combos := []map[string]float64{{}}
	for _, set := range settings {
		if !slices.Contains(setNames, set.Name) {
			return SweepReport{}, fmt.Errorf("sweep: unknown setting %q (want one of %s)", set.Name, strings.Join(setNames, ", "))
		}
		routerName = cmp.Or(setRouters[set.Name], routerName)
		var next []map[string]float64
		for _, c := range combos {
			for _, v := range set.Values {
				m := maps.Clone(c)
				m[set.Name] = v
				next = append(next, m)
			}
		}
		combos = next
	}
	rep := SweepReport{Report: newReport(cfg, []string{RoundRobin, KV}), Points: make([]SweepPoint, len(combos))}
	jobs := rep.jobs(ctx, reqs, p, cfg) // the references and the baselines
	for i, combo := range combos {
		c := cfg
		var err error
		for _, name := range slices.Sorted(maps.Keys(combo)) {
			if c, err = c.with(name, combo[name]); err != nil {
				return rep, err
			}
		}
		rep.Points[i] = SweepPoint{Settings: combo, Result: Result{Router: routerName}}
		jobs = append(jobs, func() error {
			res, err := runPrompts(ctx, reqs, p, routerName, c)
			if err != nil {
				return fmt.Errorf("sweep %v: %w", combo, err)
			}
			rep.Points[i].Result = res
			return nil
		})
	}
	err := parallel(jobs, n, progress)
	// Efficiencies once the references are in, whichever finished first.
	rep.setEfficiencies()
	for i := range rep.Points {
		rep.Points[i].setEfficiency(rep.ReusePooled)
	}
	return rep, err
}
