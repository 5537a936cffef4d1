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
	if st != (ConvertStats{Stored: 2, Removed: 1, Cleared: 1, BadBlockSize: 1, BadTokenCount: 1, OtherGroup: 2, UnknownType: 1}) || st.Rejected() != 5 {
		t.Fatalf("stats %+v", st)
	}
	if got := c.Convert(nil, &Batch{DPRank: ptr(-1), Events: b.Events}); len(got) != 0 || c.Stats().BadRank != 1 {
		t.Fatalf("negative rank: %v %+v", got, c.Stats())
	}
}
