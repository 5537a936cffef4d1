package serve

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// The written answer decodes to the answer built plainly, with maps, for
// random overlaps (none, one worker, instances with several ranks, ties),
// and a pooled buffer reused for a smaller answer leaves nothing behind.
func TestAppendScores(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	a := new(answerBuf)
	for trial := range 300 {
		res := radix.OverlapScores{Scores: map[kvevent.Worker]uint32{}, TreeSizes: map[kvevent.Worker]int{}}
		for range r.IntN(12) - trial%3 {
			wk := kvevent.Worker{ID: kvevent.WorkerID(r.IntN(6)), DPRank: kvevent.DPRank(r.IntN(3))}
			res.Scores[wk], res.TreeSizes[wk] = uint32(1+r.IntN(9)), r.IntN(1000)
		}
		var tiers radix.TierScores
		if trial%2 == 1 { // a tier-keeping index's answer
			tiers.Scores = map[kvevent.Worker][kvevent.NumTiers]uint32{}
			for range r.IntN(6) {
				wk := kvevent.Worker{ID: kvevent.WorkerID(r.IntN(6)), DPRank: kvevent.DPRank(r.IntN(3))}
				var sc [kvevent.NumTiers]uint32
				for l := range sc {
					sc[l] = uint32(r.IntN(3))
					if l > 0 {
						sc[l] += sc[l-1]
					}
				}
				tiers.Scores[wk] = sc
			}
		}
		bs := 1 + r.IntN(32)
		a.appendScores(res, tiers, bs)
		var got Scores
		if err := json.Unmarshal(a.b, &got); err != nil {
			t.Fatalf("%s: %v", a.b, err)
		}
		if want := plainScores(res, tiers, bs); !reflect.DeepEqual(got, want) {
			t.Fatalf("wrote %s\nwant %+v", a.b, want)
		}
	}
}

// plainScores is the answer built with maps: the reference.
func plainScores(res radix.OverlapScores, tiers radix.TierScores, blockSize int) Scores {
	out := Scores{Scores: map[string]map[string]uint64{}, TreeSizes: map[string]map[string]int{}, Frequencies: []int{}}
	for wk, n := range res.Scores {
		id, rank := fmt.Sprint(uint64(wk.ID)), fmt.Sprint(wk.DPRank)
		if out.Scores[id] == nil {
			out.Scores[id], out.TreeSizes[id] = map[string]uint64{}, map[string]int{}
		}
		out.Scores[id][rank] = uint64(n) * uint64(blockSize)
		out.TreeSizes[id][rank] = res.TreeSizes[wk]
		for len(out.Frequencies) < int(n) {
			out.Frequencies = append(out.Frequencies, 0)
		}
		for i := range n {
			out.Frequencies[i]++
		}
	}
	out.Instances = map[string]Instance{}
	summarise := func(wk kvevent.Worker) {
		id, rank, bs := fmt.Sprint(uint64(wk.ID)), fmt.Sprint(wk.DPRank), uint64(blockSize)
		g := uint64(res.Scores[wk])
		c, d := g, g
		if sc, ok := tiers.Scores[wk]; ok {
			c, d = max(g, uint64(sc[kvevent.TierHostPinned])), max(g, uint64(sc[kvevent.TierExternal]))
		}
		in := out.Instances[id]
		if in.DP == nil {
			in.DP = map[string]uint64{}
		}
		in.DP[rank] = g * bs
		in.GPU, in.CPU, in.Disk = max(in.GPU, g*bs), max(in.CPU, c*bs), max(in.Disk, d*bs)
		in.LongestMatched = max(in.GPU, in.CPU, in.Disk)
		out.Instances[id] = in
	}
	for wk := range res.Scores {
		summarise(wk)
	}
	for wk := range tiers.Scores {
		if _, ok := res.Scores[wk]; !ok {
			summarise(wk)
		}
	}
	if tiers.Scores != nil {
		out.TierScores = map[string]map[string]map[string]uint64{}
		for wk, sc := range tiers.Scores {
			id, rank := fmt.Sprint(uint64(wk.ID)), fmt.Sprint(wk.DPRank)
			if out.TierScores[id] == nil {
				out.TierScores[id] = map[string]map[string]uint64{}
			}
			out.TierScores[id][rank] = map[string]uint64{}
			for l, n := range sc {
				out.TierScores[id][rank][kvevent.Tier(l).String()] = uint64(n) * uint64(blockSize)
			}
		}
	}
	return out
}

// Dynamo's own case (services/overlap.rs): rank 0 of instance 7 holds 2
// blocks on the device, 1 more in host memory and 2 more on disk; rank 1
// holds 1 on the device and 1 more on disk. With blocks of 16 tokens: dp
// {0: 32, 1: 16}, gpu 32, cpu 48, disk 80, longest_matched 80.
func TestInstancesAsDynamo(t *testing.T) {
	r0, r1 := kvevent.Worker{ID: 7, DPRank: 0}, kvevent.Worker{ID: 7, DPRank: 1}
	res := radix.OverlapScores{Scores: map[kvevent.Worker]uint32{r0: 2, r1: 1}, TreeSizes: map[kvevent.Worker]int{r0: 5, r1: 2}}
	tiers := radix.TierScores{Scores: map[kvevent.Worker][kvevent.NumTiers]uint32{r0: {2, 3, 5, 5}, r1: {1, 1, 2, 2}}}
	a := new(answerBuf)
	a.appendScores(res, tiers, 16)
	var got Scores
	if err := json.Unmarshal(a.b, &got); err != nil {
		t.Fatal(err)
	}
	want := Instance{LongestMatched: 80, GPU: 32, DP: map[string]uint64{"0": 32, "1": 16}, CPU: 48, Disk: 80}
	if !reflect.DeepEqual(got.Instances["7"], want) || len(got.Instances) != 1 {
		t.Fatalf("instances %+v, want {\"7\": %+v}", got.Instances, want)
	}
}

func BenchmarkAppendScores(b *testing.B) {
	res := radix.OverlapScores{Scores: map[kvevent.Worker]uint32{}, TreeSizes: map[kvevent.Worker]int{}}
	for i := range 16 {
		wk := kvevent.Worker{ID: kvevent.WorkerID(i)}
		res.Scores[wk], res.TreeSizes[wk] = uint32(i*4), 1000
	}
	a := new(answerBuf)
	b.ReportAllocs()
	for b.Loop() {
		a.appendScores(res, radix.TierScores{}, 16)
	}
}
