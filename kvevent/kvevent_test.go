package kvevent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestDynamoJSONRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		json string
		want RouterEvent
	}{
		{
			"stored root",
			`{"worker_id":7,"storage_tier":"device","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":11,"tokens_hash":22}]}},"dp_rank":0}}`,
			RouterEvent{WorkerID: 7, Event: Event{ID: 1, Data: Stored{Blocks: []StoredBlock{{11, 22}}}}},
		},
		{
			"stored with parent, host tier, rank",
			`{"worker_id":18446744073709551615,"storage_tier":"host_pinned","event":{"event_id":2,"data":{"stored":{"parent_hash":5,"blocks":[{"block_hash":11,"tokens_hash":22},{"block_hash":12,"tokens_hash":23}]}},"dp_rank":3}}`,
			RouterEvent{WorkerID: 1<<64 - 1, Tier: TierHostPinned, Event: Event{ID: 2, DPRank: 3, Data: Stored{HasParent: true, ParentHash: 5, Blocks: []StoredBlock{{11, 22}, {12, 23}}}}},
		},
		{
			"removed",
			`{"worker_id":7,"storage_tier":"disk","event":{"event_id":3,"data":{"removed":{"block_hashes":[11,12]}},"dp_rank":0}}`,
			RouterEvent{WorkerID: 7, Tier: TierDisk, Event: Event{ID: 3, Data: Removed{BlockHashes: []uint64{11, 12}}}},
		},
		{
			"cleared",
			`{"worker_id":7,"storage_tier":"external","event":{"event_id":4,"data":"cleared","dp_rank":1}}`,
			RouterEvent{WorkerID: 7, Tier: TierExternal, Event: Event{ID: 4, DPRank: 1, Data: Cleared{}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got RouterEvent
			if err := json.Unmarshal([]byte(tc.json), &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decoded %+v, want %+v", got, tc.want)
			}
			out, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tc.json {
				t.Fatalf("encoded\n%s\nwant\n%s", out, tc.json)
			}
		})
	}
}

func TestJSONDefaults(t *testing.T) {
	var got RouterEvent
	err := json.Unmarshal([]byte(`{"worker_id":1,"event":{"event_id":9,"data":"cleared"}}`), &got)
	if err != nil {
		t.Fatal(err)
	}
	want := RouterEvent{WorkerID: 1, Tier: TierDevice, Event: Event{ID: 9, Data: Cleared{}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v", got)
	}
	if got.Worker() != (Worker{ID: 1}) || got.Blocks() != 0 {
		t.Fatalf("worker %v blocks %d", got.Worker(), got.Blocks())
	}
}

func TestJSONErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name, json, field, msg string
	}{
		{"bad json", `{"worker_id":`, "", "unexpected end"},
		{"unknown variant", `{"worker_id":1,"event":{"event_id":1,"data":{"moved":{}}}}`, "event.data", "unknown"},
		{"unknown string variant", `{"worker_id":1,"event":{"event_id":1,"data":"wiped"}}`, "event.data", "unknown variant"},
		{"unknown tier", `{"worker_id":1,"storage_tier":"gpu","event":{"event_id":1,"data":"cleared"}}`, "storage_tier", "unknown tier"},
		{"overflow", `{"worker_id":18446744073709551616,"event":{"event_id":1,"data":"cleared"}}`, "worker_id", "cannot use"},
		{"negative", `{"worker_id":1,"event":{"event_id":-1,"data":"cleared"}}`, "event.event_id", "cannot use"},
		{"overflow inside a block", `{"worker_id":1,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1e30,"tokens_hash":2}]}}}}`, "event.data.stored.blocks[0].block_hash", "cannot use"},
		{"trailing garbage", `{"worker_id":1,"event":{"event_id":1,"data":"cleared"}} x`, "", "after top-level value"},
		{"string as id", `{"worker_id":"1","event":{"event_id":1,"data":"cleared"}}`, "worker_id", "cannot use a string"},
		{"fractional id", `{"worker_id":1.5,"event":{"event_id":1,"data":"cleared"}}`, "worker_id", "cannot use number 1.5"},
		{"rank over u32", `{"worker_id":1,"event":{"event_id":1,"data":"cleared","dp_rank":4294967296}}`, "event.dp_rank", "uint32"},
		{"rank past MaxDPRank", `{"worker_id":1,"event":{"event_id":1,"data":"cleared","dp_rank":1073741824}}`, "event.dp_rank", "past the highest"},
		{"bad removed hash", `{"worker_id":1,"event":{"event_id":1,"data":{"removed":{"block_hashes":[1,-2]}}}}`, "event.data.removed.block_hashes[1]", "cannot use number -2"},
		{"null worker", `{"worker_id":null,"event":{"event_id":1,"data":"cleared"}}`, "worker_id", "missing"},
		{"invalid skipped value", `{"worker_id":1,"extra":[1,},"event":{"event_id":1,"data":"cleared"}}`, "", "invalid character"},
		{"two variants", `{"worker_id":1,"event":{"event_id":1,"data":{"stored":{"blocks":[]},"removed":{"block_hashes":[]}}}}`, "event.data", "two variants"},
		{"missing worker", `{"event":{"event_id":1,"data":"cleared"}}`, "worker_id", "missing"},
		{"missing event", `{"worker_id":1}`, "event", "missing"},
		{"missing event id", `{"worker_id":1,"event":{"data":"cleared"}}`, "event.event_id", "missing"},
		{"missing data", `{"worker_id":1,"event":{"event_id":1}}`, "event.data", "missing"},
		{"missing tokens hash", `{"worker_id":1,"event":{"event_id":1,"data":{"stored":{"blocks":[{"block_hash":1}]}}}}`, "event.data.stored.blocks[0].tokens_hash", "missing"},
		{"missing block hashes", `{"worker_id":1,"event":{"event_id":1,"data":{"removed":{}}}}`, "event.data.removed.block_hashes", "missing"},
		{"data not object", `{"worker_id":1,"event":{"event_id":1,"data":[1]}}`, "event.data", "want"},
		{"no variant", `{"worker_id":1,"event":{"event_id":1,"data":{}}}`, "event.data", "no variant"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ev RouterEvent
			err := json.Unmarshal([]byte(tc.json), &ev)
			if err == nil {
				t.Fatalf("decoded %+v, want an error", ev)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			if tc.field == "" {
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Errorf("error %q: field %v, want %q", err, fe, tc.field)
			}
		})
	}
}

// Dynamo may add fields (mm_extra_info on blocks, say): unknown keys are
// skipped everywhere but in the variant object, and escapes are decoded.
func TestJSONToleratesUnknownKeys(t *testing.T) {
	in := `{"worker_id":7,"extra":{"a":[1,2,{"b":null}]},"storage_tier":"host\u005fpinned","event":{"event_id":1,` +
		`"data":{"stored":{"parent_hash":null,"lora":"x","blocks":[{"block_hash":11,"mm_extra_info":{"mm_objects":[]},"tokens_hash":22}]}},"dp_rank":null}}`
	var got RouterEvent
	if err := json.Unmarshal([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	want := RouterEvent{WorkerID: 7, Tier: TierHostPinned, Event: Event{ID: 1, Data: Stored{Blocks: []StoredBlock{{BlockHash: 11, TokensHash: 22}}}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v", got)
	}
}

func TestTier(t *testing.T) {
	for i, name := range []string{"device", "host_pinned", "disk", "external"} {
		tier, err := ParseTier(name)
		if err != nil || tier != Tier(i) || tier.String() != name {
			t.Errorf("%s: %v %v", name, tier, err)
		}
		if tier.IsGPU() != (tier == TierDevice) {
			t.Errorf("%s: IsGPU %v", name, tier.IsGPU())
		}
	}
	if Tier(9).String() != "tier(9)" {
		t.Error(Tier(9).String())
	}
}

func TestReaderWriter(t *testing.T) {
	evs := []RouterEvent{
		{WorkerID: 1, Event: Event{ID: 1, Data: Stored{Blocks: []StoredBlock{{1, 2}}}}},
		{WorkerID: 2, Tier: TierDisk, Event: Event{ID: 2, DPRank: 1, Data: Removed{BlockHashes: []uint64{1}}}},
		{WorkerID: 3, Event: Event{ID: 3, Data: Cleared{}}},
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for i := range evs {
		if err := w.Write(&evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	// A blank line and a missing final newline are both fine.
	in := strings.Replace(buf.String(), "\n", "\n\n", 1)
	in = strings.TrimSuffix(in, "\n")
	r := NewReader(strings.NewReader(in))
	for i := range evs {
		got, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, evs[i]) {
			t.Fatalf("event %d: %+v, want %+v", i, got, evs[i])
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last event: %v, want io.EOF", err)
	}
}

// Without encoding/json's validation in front, the decoder's own syntax
// errors name the field too.
func TestDecoderSyntaxErrorsNameTheField(t *testing.T) {
	for in, field := range map[string]string{
		`{"worker_id":1,"extra":[1,},"event":{"event_id":1,"data":"cleared"}}`:                                                   "extra",
		`{"worker_id":1,"event":{"event_id":1,"data":{"stored":{"blocks":[{"block_hash":1,"tokens_hash":2},{"block_hash":}]}}}}`: "event.data.stored.blocks[1].block_hash",
		`{"worker_id":1,"event":{"event_id":1,"data":"cleared"`:                                                                  "event",
	} {
		var ev RouterEvent
		err := ev.UnmarshalJSON([]byte(in))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want field %q", in, err, field)
		}
	}
}

func TestReaderNamesTheLine(t *testing.T) {
	in := `{"worker_id":1,"event":{"event_id":1,"data":"cleared"}}
{"worker_id":1,"storage_tier":"tape","event":{"event_id":2,"data":"cleared"}}
`
	r := NewReader(strings.NewReader(in))
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	_, err := r.Next()
	var le *LineError
	var fe *FieldError
	if !errors.As(err, &le) || le.Line != 2 || !errors.As(err, &fe) || fe.Field != "storage_tier" {
		t.Fatalf("got %v, want a line 2 storage_tier error", err)
	}
	if !strings.HasPrefix(err.Error(), "line 2: storage_tier: ") {
		t.Fatalf("message %q", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"worker_id":7,"storage_tier":"device","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":11,"tokens_hash":22}]}},"dp_rank":0}}`))
	f.Add([]byte(`{"worker_id":7,"event":{"event_id":3,"data":{"removed":{"block_hashes":[11,12]}}}}`))
	f.Add([]byte(`{"worker_id":7,"event":{"event_id":3,"data":"cleared","dp_rank":2}}`))
	f.Add([]byte(`{"worker_id":7,"event":{"event_id":3,"data":{"stored":{"parent_hash":4,"blocks":[]}}}}`))
	f.Add([]byte(`{"worker_id":7,"x":` + strings.Repeat("[", MaxNesting+1) + strings.Repeat("]", MaxNesting+1) + `,"event":{"event_id":3,"data":"cleared"}}`))
	f.Add([]byte(`{"worker_id":7,"x":` + strings.Repeat(`{"a":`, MaxNesting) + `1` + strings.Repeat("}", MaxNesting) + `,"event":{"event_id":3,"data":"cleared"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var ev RouterEvent
		if err := ev.UnmarshalJSON(b); err != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		out := ev.AppendJSON(nil)
		var again RouterEvent
		if err := again.UnmarshalJSON(out); err != nil {
			t.Fatalf("re-decoding %s: %v", out, err)
		}
		if !reflect.DeepEqual(ev, again) {
			t.Fatalf("round trip changed %+v into %+v", ev, again)
		}
		if out2 := again.AppendJSON(nil); !bytes.Equal(out, out2) {
			t.Fatalf("encoding is not stable: %s vs %s", out, out2)
		}
	})
}

func BenchmarkJSON(b *testing.B) {
	for _, n := range []int{1, 16} {
		blocks := make([]StoredBlock, n)
		for i := range blocks {
			blocks[i] = StoredBlock{BlockHash: uint64(i) * 0x9E3779B97F4A7C15, TokensHash: uint64(i) * 0xBF58476D1CE4E5B9}
		}
		ev := RouterEvent{WorkerID: 42, Event: Event{ID: 1000, Data: Stored{HasParent: true, ParentHash: 77, Blocks: blocks}}}
		data := ev.AppendJSON(nil)
		name := "blocks=" + map[int]string{1: "1", 16: "16"}[n]
		b.Run("op=decode/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			var out RouterEvent
			for b.Loop() {
				if err := out.UnmarshalJSON(data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
		b.Run("op=encode/"+name, func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			for b.Loop() {
				buf = ev.AppendJSON(buf[:0])
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// TestDecodeBounds: nesting that would overflow the stack and block arrays
// that would allocate gigabytes are errors naming the field, not crashes.
func TestDecodeBounds(t *testing.T) {
	tail := `,"event":{"event_id":3,"data":"cleared"}}`
	ok := `{"worker_id":7,"x":` + strings.Repeat("[", MaxNesting) + strings.Repeat("]", MaxNesting) + tail
	var ev RouterEvent
	if err := ev.UnmarshalJSON([]byte(ok)); err != nil {
		t.Fatalf("nesting %d: %v", MaxNesting, err)
	}
	// 6 MB of '[' overflowed the goroutine stack before the bound.
	deep := `{"worker_id":7,"x":` + strings.Repeat("[", 6<<20) + tail
	err := ev.UnmarshalJSON([]byte(deep))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "x" || !errors.Is(err, ErrTooDeep) {
		t.Fatalf("deep nesting: %v", err)
	}

	var b strings.Builder
	b.WriteString(`{"worker_id":7,"event":{"event_id":1,"data":{"removed":{"block_hashes":[`)
	for i := range MaxBlocks + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('1')
	}
	b.WriteString(`]}}}}`)
	err = ev.UnmarshalJSON([]byte(b.String()))
	if !errors.As(err, &fe) || !strings.HasSuffix(fe.Field, "removed.block_hashes") || !errors.Is(err, ErrTooMany) {
		t.Fatalf("too many hashes: %v", err)
	}
	stored := `{"worker_id":7,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[` +
		strings.Repeat(`{"block_hash":1,"tokens_hash":2},`, MaxBlocks) + `{"block_hash":1,"tokens_hash":2}]}}}}`
	err = ev.UnmarshalJSON([]byte(stored))
	if !errors.As(err, &fe) || !strings.HasSuffix(fe.Field, "stored.blocks") || !errors.Is(err, ErrTooMany) {
		t.Fatalf("too many blocks: %v", err)
	}
}

// TestReaderSkipsOverlongLines: a line over the bound is reported with its
// own number, and its tail is never decoded as an event of its own.
func TestReaderSkipsOverlongLines(t *testing.T) {
	crafted := `{"worker_id":666,"event":{"event_id":1,"data":"cleared"}}`
	good := `{"worker_id":7,"event":{"event_id":2,"data":"cleared"}}`
	in := good + "\n" + `{"worker_id":1,"x":"` + strings.Repeat("a", MaxLineBytes) + `"}` + crafted + "\n" + good + "\n"
	r := NewReader(strings.NewReader(in))
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	_, err := r.Next()
	var le *LineError
	if !errors.As(err, &le) || le.Line != 2 {
		t.Fatalf("overlong line: %v", err)
	}
	ev, err := r.Next()
	if err != nil || ev.WorkerID != 7 || r.Line() != 3 {
		t.Fatalf("after the overlong line: worker %d line %d (%v), want worker 7 line 3", ev.WorkerID, r.Line(), err)
	}
}

// foreign tries to be event data from outside the package.
type foreign struct{}

func (foreign) Kind() Kind { return KindStored }

func TestDataIsSealed(t *testing.T) {
	if reflect.TypeFor[foreign]().Implements(reflect.TypeFor[Data]()) {
		t.Fatal("a type outside the variants satisfies Data")
	}
}
