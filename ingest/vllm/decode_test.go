package vllm

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
)

const (
	hashH = 0x9E3779B97F4A7C15
	hashP = 0x0123456789ABCDEF
)

type vector struct {
	Name     string `json:"name"`
	EventHex string `json:"event_hex"`
	BatchHex string `json:"batch_hex"`
}

func loadVectors(t testing.TB) []vector { return loadVectorFile(t, "testdata/handmade-vectors.json") }

func loadVectorFile(t testing.TB, file string) []vector {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return f.Vectors
}

func ptr[T any](v T) *T { return &v }

// The events the hand-derived vectors encode (the package doc's wire
// format).
var wantEvents = map[string]Event{
	"stored":  {Type: BlockStored, BlockHashes: []uint64{hashH}, ParentBlockHash: ptr[uint64](hashP), TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: "GPU", KVCacheSpecKind: "full_attention"},
	"removed": {Type: BlockRemoved, BlockHashes: []uint64{hashH}, Medium: "GPU"},
	"cleared": {Type: AllBlocksCleared},
}

// Both encodings of the hand-derived vectors decode to the same events,
// and encoding those events gives the vectors' bytes back exactly.
func TestHandmadeVectors(t *testing.T) {
	vs := loadVectors(t)
	if len(vs) != 6 {
		t.Fatalf("%d vectors", len(vs))
	}
	for _, v := range vs {
		enc, kind, _ := strings.Cut(v.Name, "_")
		want := wantEvents[kind]
		raw, err := hex.DecodeString(v.BatchHex)
		if err != nil {
			t.Fatal(err)
		}
		b, err := DecodeBatch(raw)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if b.TS != 1.5 || b.DPRank == nil || *b.DPRank != 0 || len(b.Events) != 1 {
			t.Fatalf("%s: envelope %+v", v.Name, b)
		}
		if !reflect.DeepEqual(b.Events[0], want) {
			t.Fatalf("%s: decoded\n%+v\nwant\n%+v", v.Name, b.Events[0], want)
		}
		e := ArrayEncoding
		if enc == "map" {
			e = MapEncoding
		}
		if got := hex.EncodeToString(AppendBatch(nil, &b, e)); got != v.BatchHex {
			t.Fatalf("%s: encoded\n%s\nwant\n%s", v.Name, got, v.BatchHex)
		}
	}
}

// The vectors of the newer shapes decode to these batches (an event's Err
// is compared by its field), and the encoder writes the good ones of the
// shapes it writes back byte for byte (not RFC #1527's: kvradix only reads
// them).
func TestNewerShapes(t *testing.T) {
	vectors := loadVectorFile(t, "testdata/newer-shapes.json")
	cleared := Event{Type: AllBlocksCleared}
	const rfcTS = 1770000000000 // RFC #1527's timestamp, in ms
	const notWritten Encoding = 255
	want := map[string]struct {
		events []Event
		enc    Encoding
		ts     float64
		bad    int    // the event that did not decode, if badAt is set
		badAt  string // the field an ErrBadEvents error names
	}{
		"map_envelope":         {[]Event{cleared}, MapEnvelopeEncoding, 1.5, 0, ""},
		"sglang_salted_stored": {[]Event{{Type: BlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU", CacheSalt: "s1"}}, ArrayEncoding, 1.5, 0, ""},
		"map_remote_removed":   {[]Event{{Type: BlockRemoved, BlockHashes: []uint64{5}, Medium: "GPU", Locality: "REMOTE"}}, MapEncoding, 1.5, 0, ""},
		"map_removed_copies":   {[]Event{{Type: BlockRemoved, BlockHashes: []uint64{5, 6}, Medium: "GPU", RemainingCopies: []uint32{1, 0}}}, MapEncoding, 1.5, 0, ""},
		"one_bad_event":        {[]Event{cleared, {}, cleared}, ArrayEncoding, 1.5, 1, "block_hashes[0]"},
		"rfc1527_stored": {[]Event{{Type: BlockStored, BlockHashes: []uint64{5, 6}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "CPU",
			ModelName: "m", TenantID: "default"}}, notWritten, rfcTS, 0, ""},
		"rfc1527_legacy_removed":   {[]Event{{Type: BlockRemoved, BlockHashes: []uint64{7}, Medium: "DISK", TenantID: "default"}}, notWritten, rfcTS, 0, ""},
		"rfc1527_master_no_tokens": {[]Event{{}, cleared}, notWritten, rfcTS, 0, "token_ids"},
		"rfc1527_names_disagree":   {[]Event{{}}, notWritten, rfcTS, 0, "block_hashes"},
		"map_salt_ownership_pair": {[]Event{
			{Type: BlockStored, BlockHashes: []uint64{9}, TokenIDs: []uint32{1, 2}, BlockSize: 2, LoRAName: "adapter", CacheSalt: "salt-1"},
			{Type: BlockStored, BlockHashes: []uint64{10}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "STORAGE", Locality: "LOCAL", Ownership: "kvcr"},
			{Type: BlockStored, BlockHashes: []uint64{11}, TokenIDs: []uint32{1, 2}, BlockSize: 2, MultimodalAt: 1}}, notWritten, 1.5, 0, ""},
		"map_reused_stored": {[]Event{{Type: BlockStored, BlockHashes: []uint64{12}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Origin: "REUSED"}}, notWritten, 1.5, 0, ""},
		"map_multimodal_stored": {[]Event{
			{Type: BlockStored, BlockHashes: []uint64{1, 2, 3}, TokenIDs: []uint32{1, 2, 3, 4, 5, 6}, BlockSize: 2, LoRAName: "my-lora", MultimodalAt: 2},
			{Type: BlockStored, BlockHashes: []uint64{4}, TokenIDs: []uint32{0, 0}, BlockSize: 2, MultimodalAt: 1}}, notWritten, 1.5, 0, ""},
	}
	if len(vectors) != len(want) {
		t.Fatalf("%d vectors, want %d", len(vectors), len(want))
	}
	for _, v := range vectors {
		w, ok := want[v.Name]
		if !ok {
			t.Fatalf("vector %q unknown", v.Name)
		}
		b, err := DecodeBatch(mustHex(v.BatchHex))
		var de *DecodeError
		switch {
		case w.badAt == "" && err != nil:
			t.Fatalf("%s: %v", v.Name, err)
		case w.badAt != "" && (!errors.Is(err, ErrBadEvents) || !errors.As(err, &de) || de.Field != w.badAt || de.Event != w.bad):
			t.Fatalf("%s: error %v, want ErrBadEvents at event %d, %s", v.Name, err, w.bad, w.badAt)
		}
		if b.TS != w.ts || b.DPRank == nil || *b.DPRank != 0 || len(b.Events) != len(w.events) {
			t.Fatalf("%s: envelope %+v", v.Name, b)
		}
		for i, ev := range b.Events {
			if (ev.Err != nil) != (w.badAt != "" && i == w.bad) {
				t.Fatalf("%s: event %d error %v", v.Name, i, ev.Err)
			}
			ev.Err = nil
			if !reflect.DeepEqual(ev, w.events[i]) {
				t.Fatalf("%s: event %d\n%+v\nwant\n%+v", v.Name, i, ev, w.events[i])
			}
		}
		if w.badAt == "" && w.enc != notWritten {
			if got := hex.EncodeToString(AppendBatch(nil, &b, w.enc)); got != v.BatchHex {
				t.Fatalf("%s: encoded\n%s\nwant\n%s", v.Name, got, v.BatchHex)
			}
		}
	}
}

// The converter drops REMOTE events, an offload connector's (ownership)
// and events that did not decode, counting each, and hashes a salted store apart from the same tokens
// unsalted.
func TestConvertNewerShapes(t *testing.T) {
	c := NewConverter(1, 2)
	stored := Event{Type: BlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{1, 2}, BlockSize: 2}
	salted := stored
	salted.BlockHashes, salted.CacheSalt = []uint64{6}, "s1"
	remote := Event{Type: BlockRemoved, BlockHashes: []uint64{5}, Locality: "REMOTE"}
	local := Event{Type: BlockRemoved, BlockHashes: []uint64{5}, Locality: "LOCAL"}
	owned := stored
	owned.Ownership = "kvcr"
	out := c.Convert(nil, &Batch{Events: []Event{stored, salted, remote, {Err: errors.New("bad")}, owned, local}})
	if len(out) != 3 {
		t.Fatalf("%d events out, want 3: %+v", len(out), out)
	}
	plain, withSalt := out[0].Event.Data.(kvevent.Stored), out[1].Event.Data.(kvevent.Stored)
	if plain.Blocks[0].TokensHash == withSalt.Blocks[0].TokensHash {
		t.Fatal("a salted block hashes as the same tokens unsalted")
	}
	if st := c.Stats(); st.Remote != 1 || st.Undecodable != 1 || st.Ownership != 1 || st.Rejected() != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// A store is cut at its first block with a multimodal input: the text
// blocks before it are indexed (their copies counted), and a store whose
// first block has one is dropped; each is counted.
func TestConvertMultimodal(t *testing.T) {
	c := NewConverter(1, 2)
	cut := Event{Type: BlockStored, BlockHashes: []uint64{1, 2, 3}, TokenIDs: []uint32{1, 2, 3, 4, 5, 6}, BlockSize: 2, MultimodalAt: 2}
	whole := Event{Type: BlockStored, BlockHashes: []uint64{4}, TokenIDs: []uint32{0, 0}, BlockSize: 2, MultimodalAt: 1}
	out := c.Convert(nil, &Batch{Events: []Event{cut, whole}})
	if len(out) != 1 {
		t.Fatalf("%d events out, want 1: %+v", len(out), out)
	}
	st := out[0].Event.Data.(kvevent.Stored)
	want := hashing.LocalHashes(nil, []uint32{1, 2}, 2, hashing.Options{})
	if len(st.Blocks) != 1 || st.Blocks[0].BlockHash != 1 || st.Blocks[0].TokensHash != want[0] {
		t.Fatalf("stored %+v, want block 1 alone", st)
	}
	if s := c.Stats(); s.Multimodal != 2 || s.CopyCounts != 1 || s.Stored != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// RFC #1527's events convert as vLLM's: a nil block size is the
// engine's, lower-case media are their tiers. An event naming another
// model or tenant than the engine's is dropped and counted; "default" is
// the unnamed tenant, and an engine of unknown model takes any model.
func TestConvertRFC1527(t *testing.T) {
	stored := Event{Type: BlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{1, 2}, Medium: internMedium([]byte("disk")), ModelName: "m", TenantID: "default"}
	with := func(model, tenant string) Event {
		ev := stored
		ev.ModelName, ev.TenantID = model, tenant
		return ev
	}
	for _, tc := range []struct {
		model, tenant string // the engine's
		events        []Event
		kept          int
	}{
		{"m", "default", []Event{stored, with("n", "default"), with("m", "t"), with("", "")}, 2},
		{"m", "", []Event{stored, with("m", ""), with("m", "t")}, 2},
		{"", "t", []Event{with("any", "t"), with("m", "default")}, 1},
	} {
		c := NewConverter(1, 2)
		c.Model, c.Tenant = tc.model, tc.tenant
		out := c.Convert(nil, &Batch{Events: tc.events})
		if len(out) != tc.kept || out[0].Tier != kvevent.TierDisk {
			t.Fatalf("engine %q/%q: %d events out, want %d on the disk tier: %+v", tc.model, tc.tenant, len(out), tc.kept, out)
		}
		if st := c.Stats(); st.Foreign != uint64(len(tc.events)-tc.kept) || st.Rejected() != st.Foreign {
			t.Fatalf("engine %q/%q: stats %+v", tc.model, tc.tenant, st)
		}
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return b
}

func TestDecodeVariants(t *testing.T) {
	tests := []struct {
		name string
		hex  string
		want Batch
	}{
		{"two-element envelope, first-version 6-field stored, narrow and signed hashes",
			"92 cb3ff8000000000000 91 96 ab426c6f636b53746f726564 93 05 d1ff00 cd0100 c0 92 01 02 02 c0",
			Batch{TS: 1.5, Events: []Event{{Type: BlockStored, BlockHashes: []uint64{5, 0xFFFFFFFFFFFFFF00, 256}, TokenIDs: []uint32{1, 2}, BlockSize: 2}}}},
		{"nil rank, integer ts, bin hashes of 32 and 2 bytes, trailing envelope element",
			"94 05 91 92 ac426c6f636b52656d6f766564 92 c420" + strings.Repeat("00", 24) + "0102030405060708 c4020102 c0 c0",
			Batch{TS: 5, Events: []Event{{Type: BlockRemoved, BlockHashes: []uint64{0x0102030405060708, 0x0102}}}}},
		{"map with unknown keys, lora name and wide token ids",
			"93 cb3ff8000000000000 91 86 a474797065 ab426c6f636b53746f726564 a86c6f63616c697479 a3677075 ac626c6f636b5f686173686573 91 07 a9746f6b656e5f696473 92 ce00010000 cd0100 aa626c6f636b5f73697a65 02 a96c6f72615f6e616d65 a3616263 01",
			Batch{TS: 1.5, DPRank: ptr(1), Events: []Event{{Type: BlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{65536, 256}, BlockSize: 2, LoRAName: "abc", Locality: "GPU"}}}}, // known strings are read in any case
		{"SGLang's array with its session_id where vLLM's extra_keys are",
			"93 cb3ff8000000000000 91 99 ab426c6f636b53746f726564 91 05 c0 92 01 02 02 c0 a3475055 c0 a57265712d31 00",
			Batch{TS: 1.5, DPRank: ptr(0), Events: []Event{{Type: BlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"}}}},
		{"array event with extra trailing elements, unknown event type kept",
			"93 cb3ff8000000000000 92 95 ac426c6f636b52656d6f766564 91 01 a3435055 03 a178 92 a64e6577457665 01 00",
			Batch{TS: 1.5, DPRank: ptr(0), Events: []Event{{Type: BlockRemoved, BlockHashes: []uint64{1}, Medium: "CPU", GroupIdx: 3}, {Type: "NewEve"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeBatch(mustHex(tc.hex))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestDecodeErrorsSayWhere(t *testing.T) {
	tests := []struct {
		name, hex string
		event     int
		field     string
	}{
		{"not an array", "a3616263", -1, "batch"},
		{"one element", "91 01", -1, "batch"},
		{"ts a string", "92 a161 90", -1, "ts"},
		{"events not an array", "92 01 01", -1, "events"},
		{"rank a string", "93 01 90 a161", -1, "data_parallel_rank"},
		{"rank past kvevent.MaxDPRank", "93 01 90 ce40000000", -1, "data_parallel_rank"},
		{"event not a container", "92 01 91 01", 0, "event"},
		{"hash a string", "92 01 92 91 b0416c6c426c6f636b73436c6561726564 92 ac426c6f636b52656d6f766564 91 a161", 1, "block_hashes[0]"},
		{"bin hash too long", "92 01 91 92 ac426c6f636b52656d6f766564 91 c421" + strings.Repeat("00", 33), 0, "block_hashes[0]"},
		{"negative token", "92 01 91 95 ab426c6f636b53746f726564 91 01 c0 91 ff 01", 0, "token_ids[0]"},
		{"token over u32", "92 01 91 95 ab426c6f636b53746f726564 91 01 c0 91 cf0000000100000000 01", 0, "token_ids[0]"},
		{"short stored", "92 01 91 93 ab426c6f636b53746f726564 91 01 c0", 0, "event"},
		{"map without type", "92 01 91 81 ac626c6f636b5f686173686573 90", 0, "type"},
		{"map stored without tokens", "92 01 91 83 a474797065 ab426c6f636b53746f726564 ac626c6f636b5f686173686573 90 aa626c6f636b5f73697a65 01", 0, "token_ids"},
		{"truncated", "92 01 91 95 ab426c6f636b53746f726564 91", 0, "block_hashes"},
		{"huge count", "92 01 dd7fffffff", -1, "events"},
	}
	for _, tc := range tests {
		_, err := DecodeBatch(mustHex(tc.hex))
		var de *DecodeError
		if !errors.As(err, &de) || de.Event != tc.event || de.Field != tc.field {
			t.Errorf("%s: got %v, want event %d field %q", tc.name, err, tc.event, tc.field)
		}
	}
}

// FuzzDecodeBatch: no input panics; whatever decodes re-encodes (both
// encodings) and decodes to the same batch.
func FuzzDecodeBatch(f *testing.F) {
	for _, v := range append(loadVectors(f), loadVectorFile(f, "testdata/newer-shapes.json")...) {
		f.Add(mustHex(v.BatchHex))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err != nil {
			return
		}
		for _, enc := range []Encoding{ArrayEncoding, MapEncoding, MapEnvelopeEncoding} {
			again, err := DecodeBatch(AppendBatch(nil, &b, enc))
			if err != nil {
				t.Fatalf("%v re-decode: %v", enc, err)
			}
			if want := carried(b, enc); !sameBatch(want, again) {
				t.Fatalf("%v round trip:\n%+v\n%+v", enc, want, again)
			}
		}
	})
}

// carried returns b as enc carries it: the array encoding has no locality,
// and a salt only on a store without a LoRA name (SGLang's metadata map,
// which has no group or cache spec); map events carry a salt only on
// stores. No encoding carries what only RFC #1527 events say (model and
// tenant), extra keys (written as nils), ownership or origin; copy counts
// only map events carry.
func carried(b Batch, enc Encoding) Batch {
	evs := make([]Event, len(b.Events))
	for i, ev := range b.Events {
		ev.ModelName, ev.TenantID, ev.MultimodalAt, ev.Ownership, ev.Origin = "", "", 0, "", ""
		if enc == ArrayEncoding || ev.Type != BlockRemoved {
			ev.RemainingCopies = nil
		}
		if ev.Type != BlockStored {
			ev.CacheSalt = ""
		}
		if enc == ArrayEncoding {
			ev.Locality = ""
			switch {
			case ev.LoRAName != "":
				ev.CacheSalt = ""
			case ev.CacheSalt != "":
				ev.GroupIdx, ev.KVCacheSpecKind = 0, ""
			}
		}
		evs[i] = ev
	}
	b.Events = evs
	return b
}

// sameBatch compares batches as the encoder can reproduce them: unknown
// event types carry no fields, empty slices equal nil ones.
func sameBatch(a, b Batch) bool {
	if a.TS != b.TS && !(a.TS != a.TS && b.TS != b.TS) || (a.DPRank == nil) != (b.DPRank == nil) || len(a.Events) != len(b.Events) {
		return false
	}
	if a.DPRank != nil && *a.DPRank != *b.DPRank {
		return false
	}
	for i := range a.Events {
		x, y := a.Events[i], b.Events[i]
		if x.Type != BlockStored {
			x.ParentBlockHash, x.TokenIDs, x.BlockSize, x.LoRAName, x.KVCacheSpecKind = nil, nil, 0, "", ""
			if x.Type != BlockRemoved {
				x.BlockHashes, x.Medium, x.GroupIdx, x.Locality = nil, "", 0, ""
			}
		}
		if len(x.BlockHashes) == 0 {
			x.BlockHashes = nil
		}
		if len(y.BlockHashes) == 0 {
			y.BlockHashes = nil
		}
		if len(x.TokenIDs) == 0 {
			x.TokenIDs = nil
		}
		if len(y.TokenIDs) == 0 {
			y.TokenIDs = nil
		}
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// TestDecodeBatchBoundsEvents: a header claiming more events than a batch
// may hold is an error naming the field, before any allocation for them.
func TestDecodeBatchBoundsEvents(t *testing.T) {
	payload := msgp.AppendArrayHeader(nil, 3)
	payload = msgp.AppendFloat64(payload, 1)
	payload = msgp.AppendArrayHeader(payload, MaxBatchEvents+1)
	payload = append(payload, make([]byte, MaxBatchEvents+1)...) // enough bytes to pass the length check
	_, err := DecodeBatch(payload)
	if err == nil || !strings.Contains(err.Error(), "events") || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("oversized batch: %v", err)
	}
}

// TestDecodeBoundsHashesAndTokens: an event with more block hashes than
// kvevent.MaxBlocks, or more token ids than MaxTokens, is refused naming
// the field and the bound, before the arrays are allocated (a frame of 8
// MB used to decode into 64 MB): nothing ingest accepts is undecodable
// elsewhere.
func TestDecodeBoundsHashesAndTokens(t *testing.T) {
	stored := func(hashes, tokens uint32) []byte {
		b := msgp.AppendArrayHeader(nil, 2)
		b = msgp.AppendFloat64(b, 1)
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendArrayHeader(b, 5)
		b = msgp.AppendString(b, "BlockStored")
		b = msgp.AppendArrayHeader(b, hashes)
		for range min(hashes, 4) {
			b = msgp.AppendUint64(b, 7)
		}
		b = msgp.AppendNil(b)
		b = msgp.AppendArrayHeader(b, tokens)
		b = append(b, make([]byte, 8<<20)...) // enough bytes to pass the length checks
		return b
	}
	for _, tc := range []struct {
		name          string
		hashes, toks  uint32
		field, reason string
	}{
		{"hashes", kvevent.MaxBlocks + 1, 0, "block_hashes", "blocks in one event"},
		{"tokens", 1, MaxTokens + 1, "token_ids", "token ids in one event"},
	} {
		_, err := DecodeBatch(stored(tc.hashes, tc.toks))
		var de *DecodeError
		if !errors.As(err, &de) || de.Field != tc.field || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: %v, want field %q saying %q", tc.name, err, tc.field, tc.reason)
		}
	}
}
