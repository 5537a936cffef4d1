package vllm

import (
	"reflect"
	"testing"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
)

func TestMediumTier(t *testing.T) {
	for medium, want := range map[string]kvevent.Tier{
		"": kvevent.TierDevice, "GPU": kvevent.TierDevice, "DEVICE": kvevent.TierDevice, "HBM?": kvevent.TierDevice,
		"CPU": kvevent.TierHostPinned, "CPU_PINNED": kvevent.TierHostPinned, "CPU_TIER1": kvevent.TierHostPinned,
		"CPU_TIER2": kvevent.TierDisk, "DISK": kvevent.TierDisk, "NVME": kvevent.TierDisk, "STORAGE": kvevent.TierDisk,
		"EXTERNAL": kvevent.TierExternal, "NETWORK": kvevent.TierExternal, "REMOTE": kvevent.TierExternal, "SHARED": kvevent.TierExternal,
	} {
		if got := MediumTier(medium); got != want {
			t.Errorf("%q: %v, want %v", medium, got, want)
		}
	}
}

func TestConvert(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	local := hashing.LocalHashes(nil, tokens, 4, hashing.Options{})
	loraLocal := hashing.LocalHashes(nil, tokens[:4], 4, hashing.Options{LoRAName: "ad"})
	b := Batch{DPRank: ptr(2), Events: []Event{
		{Type: BlockStored, BlockHashes: []uint64{10, 11}, TokenIDs: tokens, BlockSize: 4, Medium: "GPU"},
		{Type: BlockStored, BlockHashes: []uint64{12}, ParentBlockHash: ptr[uint64](11), TokenIDs: tokens[:4], BlockSize: 4, LoRAName: "ad", Medium: "CPU"},
		{Type: BlockStored, BlockHashes: []uint64{13}, TokenIDs: tokens[:4], BlockSize: 16},             // foreign block size
		{Type: BlockStored, BlockHashes: []uint64{14}, TokenIDs: tokens[:3], BlockSize: 4},              // partial
		{Type: BlockStored, BlockHashes: []uint64{15}, TokenIDs: tokens[:4], BlockSize: 4, GroupIdx: 1}, // auxiliary group
		{Type: BlockRemoved, BlockHashes: []uint64{10}},
		{Type: BlockRemoved, BlockHashes: []uint64{10}, GroupIdx: 2},
		{Type: AllBlocksCleared},
		{Type: "BlockTouched"},
	}}
	c := NewConverter(7, 4)
	got := c.Convert(nil, &b)
	want := []kvevent.RouterEvent{
		{WorkerID: 7, Event: kvevent.Event{ID: 1, DPRank: 2, Data: kvevent.Stored{Blocks: []kvevent.StoredBlock{{BlockHash: 10, TokensHash: local[0]}, {BlockHash: 11, TokensHash: local[1]}}}}},
		{WorkerID: 7, Tier: kvevent.TierHostPinned, Event: kvevent.Event{ID: 2, DPRank: 2, Data: kvevent.Stored{HasParent: true, ParentHash: 11, Blocks: []kvevent.StoredBlock{{BlockHash: 12, TokensHash: loraLocal[0]}}}}},
		{WorkerID: 7, Event: kvevent.Event{ID: 3, DPRank: 2, Data: kvevent.Removed{BlockHashes: []uint64{10}}}},
		{WorkerID: 7, Event: kvevent.Event{ID: 4, DPRank: 2, Data: kvevent.Cleared{}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got, want)
	}
	st := c.Stats()
	if st != (ConvertStats{Stored: 2, Removed: 1, Cleared: 1, BadBlockSize: 1, BadTokenCount: 1, OtherGroup: 2, UnknownType: 1, CopyCounts: 1}) || st.Rejected() != 5 { // the host copy of 12 stays counted: the clear is the device's
		t.Fatalf("stats %+v", st)
	}
	if got := c.Convert(nil, &Batch{DPRank: ptr(-1), Events: b.Events}); len(got) != 0 || c.Stats().BadRank != 1 {
		t.Fatalf("negative rank: %v %+v", got, c.Stats())
	}
}

// vLLM keeps duplicate copies of a block, each stored and removed on its
// own: a hash leaves only with its last copy (per rank and tier); a hash
// never counted passes; the engine's remaining_copy_counts are taken
// as its word; a clear forgets the rank's counts; a store of origin
// REUSED is an announcement, not a copy.
func TestConvertCountsCopies(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4}
	store := func(h uint64, medium string) Event {
		return Event{Type: BlockStored, BlockHashes: []uint64{h}, TokenIDs: tokens, BlockSize: 4, Medium: medium}
	}
	reused := func(h uint64) Event {
		ev := store(h, "")
		ev.Origin = "REUSED"
		return ev
	}
	remove := func(medium string, remaining []uint32, hs ...uint64) Event {
		return Event{Type: BlockRemoved, BlockHashes: hs, Medium: medium, RemainingCopies: remaining}
	}
	c := NewConverter(1, 4)
	removedOf := func(evs ...Event) [][]uint64 {
		var out [][]uint64
		for _, ev := range c.Convert(nil, &Batch{Events: evs}) {
			if r, ok := ev.Event.Data.(kvevent.Removed); ok {
				out = append(out, r.BlockHashes)
			}
		}
		return out
	}
	for _, step := range []struct {
		name string
		evs  []Event
		want [][]uint64
	}{
		{"two copies of 10, one of 11; 10 on the host too", []Event{store(10, "GPU"), store(10, "GPU"), store(11, "GPU"), store(10, "CPU")}, nil},
		{"the first copy of 10 goes: kept; 11 goes; 99 was never counted", []Event{remove("GPU", nil, 10, 11, 99)}, [][]uint64{{11, 99}}},
		{"the host's copy is its own", []Event{remove("CPU", nil, 10)}, [][]uint64{{10}}},
		{"the last copy of 10 goes", []Event{remove("GPU", nil, 10)}, [][]uint64{{10}}},
		{"the engine says 1 copy of 12 remains", []Event{store(12, ""), remove("", []uint32{1}, 12)}, nil},
		{"then none", []Event{remove("", []uint32{0}, 12)}, [][]uint64{{12}}},
		{"counts that do not match the hashes are not its word", []Event{store(13, ""), store(13, ""), remove("", []uint32{0, 0}, 13)}, nil},
		{"a clear forgets the counts", []Event{{Type: AllBlocksCleared}, remove("", nil, 13)}, [][]uint64{{13}}},
		{"a reused block announced again is no copy", []Event{store(15, ""), reused(15), remove("", nil, 15)}, [][]uint64{{15}}},
		{"a reused block never counted is one copy", []Event{reused(16), remove("", nil, 16)}, [][]uint64{{16}}},
	} {
		if got := removedOf(step.evs...); !reflect.DeepEqual(got, step.want) {
			t.Fatalf("%s: removed %v, want %v", step.name, got, step.want)
		}
	}
	if st := c.Stats(); st.CopiesKept != 3 || st.CopyCounts != 0 {
		t.Fatalf("stats %+v: want 3 copies kept, none counted", st)
	}
	c.Convert(nil, &Batch{Events: []Event{store(14, ""), store(14, "")}})
	c.Forget(0)
	if got := removedOf(remove("", nil, 14)); !reflect.DeepEqual(got, [][]uint64{{14}}) {
		t.Fatalf("after Forget: removed %v", got)
	}
}

// Every counter of a converter reaches the subscriber's sum.
func TestConvertStatsAdd(t *testing.T) {
	var one ConvertStats
	v := reflect.ValueOf(&one).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.CanUint() {
			f.SetUint(1)
		} else {
			f.SetInt(1)
		}
	}
	var sum ConvertStats
	sum.add(one)
	sum.add(one)
	s := reflect.ValueOf(sum)
	for i := range s.NumField() {
		if f := s.Field(i); f.CanUint() && f.Uint() != 2 || !f.CanUint() && f.Int() != 2 {
			t.Errorf("%s: %v after adding 1 twice", s.Type().Field(i).Name, f)
		}
	}
}
