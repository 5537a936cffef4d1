package openloop

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
)

// randomCorpus makes a corpus of n operations of every kind, in issue
// order.
func randomCorpus(r *rand.Rand, n int) *Corpus {
	c := &Corpus{Header: Header{BlockSize: 128, ReferenceWindow: time.Second, TraceDuplication: 2, TraceLength: 4,
		WorkerDuplication: 1, LogicalWorkers: 8, TracePath: "trace/data/conversation_trace.jsonl"}}
	for i := range n {
		o := Op{Deadline: time.Duration(r.IntN(1000)) * time.Millisecond, Worker: kvevent.WorkerID(r.IntN(8))}
		ev := kvevent.Event{DPRank: kvevent.DPRank(r.IntN(3)), ID: uint64(i + 1)}
		hashes := func() []uint64 {
			hs := make([]uint64, r.IntN(5))
			for k := range hs {
				hs[k] = r.Uint64()
			}
			return hs
		}
		switch r.IntN(4) {
		case 0:
			o.Query = hashes()
		case 1:
			st := kvevent.Stored{HasParent: r.IntN(2) == 0}
			if st.HasParent {
				st.ParentHash = r.Uint64()
			}
			for range 1 + r.IntN(4) {
				st.Blocks = append(st.Blocks, kvevent.StoredBlock{BlockHash: r.Uint64(), TokensHash: r.Uint64()})
			}
			if r.IntN(3) == 0 {
				p := uint32(r.IntN(100))
				o.StartPosition = &p
			}
			ev.Data = st
			o.Event = ev
		case 2:
			ev.Data = kvevent.Removed{BlockHashes: hashes()}
			o.Event = ev
		default:
			ev.Data = kvevent.Cleared{}
			o.Event = ev
		}
		c.Ops = append(c.Ops, o)
	}
	slices.SortStableFunc(c.Ops, func(a, b Op) int { return compareOps(&a, &b) })
	return c
}

func encode(t testing.TB, c *Corpus) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sameCorpus compares corpora as the format carries them: an empty
// slice is nil.
func sameCorpus(a, b *Corpus) bool {
	norm := func(c *Corpus) *Corpus {
		out := &Corpus{Header: c.Header, Ops: slices.Clone(c.Ops)}
		for i := range out.Ops {
			o := &out.Ops[i]
			if o.IsQuery() && len(o.Query) == 0 {
				o.Query = []uint64{}
			}
			switch d := o.Event.Data.(type) {
			case kvevent.Removed:
				if len(d.BlockHashes) == 0 {
					o.Event.Data = kvevent.Removed{}
				}
			}
		}
		return out
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// A corpus written and read back is the same corpus, and written again
// the same bytes; the totals in the header are the operations'.
func TestRoundTrip(t *testing.T) {
	for seed := range uint64(20) {
		c := randomCorpus(rand.New(rand.NewPCG(seed, 1)), 300)
		data := encode(t, c)
		got, err := Read(data)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if !sameCorpus(c, got) {
			t.Fatalf("seed %d: read back differs", seed)
		}
		if again := encode(t, got); !bytes.Equal(again, data) {
			t.Fatalf("seed %d: written again, the bytes differ", seed)
		}
	}
}

// The layout, field by field, for a corpus of one query and one store,
// derived by hand from the format's table.
func TestLayoutByHand(t *testing.T) {
	p := uint32(7)
	c := &Corpus{Header: Header{BlockSize: 16, ReferenceWindow: 5, TraceDuplication: 1, TraceLength: 1, WorkerDuplication: 1, LogicalWorkers: 3, TracePath: "t"},
		Ops: []Op{
			{Deadline: 1, Worker: 2, Query: []uint64{0xAA}},
			{Deadline: 1, Worker: 1, Event: kvevent.Event{DPRank: 4, ID: 9, Data: kvevent.Stored{HasParent: true, ParentHash: 0xBB,
				Blocks: []kvevent.StoredBlock{{BlockHash: 0xCC, TokensHash: 0xDD}}}}, StartPosition: &p},
		}}
	data := encode(t, c)
	want := 112 + 8 + 1 + (8 + 8) + (8 + 16) + 8 + 8 + 33 + 59
	if len(data) != want {
		t.Fatalf("%d bytes, want %d", len(data), want)
	}
	le := func(off, n int) uint64 {
		var v uint64
		for i := n - 1; i >= 0; i-- {
			v = v<<8 | uint64(data[off+i])
		}
		return v
	}
	for _, f := range []struct {
		name      string
		off, n    int
		want      uint64
		wantBytes string
	}{
		{"magic", 0, 8, 0, Magic}, {"version", 8, 4, 1, ""}, {"block_size", 12, 4, 16, ""}, {"window", 16, 8, 5, ""},
		{"logical_workers", 48, 8, 3, ""}, {"requests", 56, 8, 1, ""}, {"stored_events", 64, 8, 1, ""},
		{"request_blocks", 88, 8, 1, ""}, {"stored_blocks", 96, 8, 1, ""}, {"path length", 112, 8, 1, ""},
		{"query slab count", 121, 8, 1, ""}, {"query hash", 129, 8, 0xAA, ""}, {"stored slab count", 137, 8, 1, ""},
		{"stored block hash", 145, 8, 0xCC, ""}, {"stored tokens hash", 153, 8, 0xDD, ""}, {"removed slab count", 161, 8, 0, ""},
		{"op count", 169, 8, 2, ""}, {"op 0 id", 177, 4, 0, ""}, {"op 0 deadline", 181, 8, 1, ""}, {"op 0 worker", 189, 8, 2, ""},
		{"op 0 kind", 197, 1, 0, ""}, {"op 0 start", 198, 8, 0, ""}, {"op 0 len", 206, 4, 1, ""},
		{"op 1 id", 210, 4, 1, ""}, {"op 1 kind", 230, 1, 1, ""}, {"op 1 rank", 231, 4, 4, ""}, {"op 1 event id", 235, 8, 9, ""},
		{"op 1 has_parent", 243, 1, 1, ""}, {"op 1 parent", 244, 8, 0xBB, ""}, {"op 1 has_start", 252, 1, 1, ""},
		{"op 1 start_position", 253, 4, 7, ""}, {"op 1 start", 257, 8, 0, ""}, {"op 1 len", 265, 4, 1, ""},
	} {
		if f.wantBytes != "" {
			if got := string(data[f.off : f.off+f.n]); got != f.wantBytes {
				t.Errorf("%s: %q", f.name, got)
			}
			continue
		}
		if got := le(f.off, f.n); got != f.want {
			t.Errorf("%s at %d: %d, want %d", f.name, f.off, got, f.want)
		}
	}
}

// Every damaged corpus is refused with an error naming the offset, never
// a panic: each truncation, and directed damage.
func TestReadRefusesDamage(t *testing.T) {
	c := randomCorpus(rand.New(rand.NewPCG(7, 7)), 40)
	data := encode(t, c)
	for n := range len(data) {
		if _, err := Read(data[:n]); err == nil || !errors.Is(err, ErrCorpus) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	damage := func(name, says string, f func(b []byte) []byte) {
		b := f(bytes.Clone(data))
		_, err := Read(b)
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, says)
		}
	}
	damage("magic", "magic", func(b []byte) []byte { b[0] = 'X'; return b })
	damage("version", "version 2", func(b []byte) []byte { b[8] = 2; return b })
	damage("totals", "totals", func(b []byte) []byte { b[56]++; return b })
	damage("trailing bytes", "after the operations", func(b []byte) []byte { return append(b, 0) })
	damage("a huge slab count", "query slab: ", func(b []byte) []byte {
		off := 120 + len(c.TracePath)
		for i := range 8 {
			b[off+i] = 0xFF
		}
		return b
	})
	// Two operations swapped break the order or the ids.
	swapped := &Corpus{Header: c.Header, Ops: slices.Clone(c.Ops)}
	swapped.Ops[0], swapped.Ops[len(swapped.Ops)-1] = swapped.Ops[len(swapped.Ops)-1], swapped.Ops[0]
	if _, err := swapped.WriteTo(&bytes.Buffer{}); err == nil {
		t.Error("a corpus out of order was written")
	}
}

// FuzzRead: no input panics or allocates past what it holds; whatever
// reads writes back to bytes that read to the same corpus.
func FuzzRead(f *testing.F) {
	f.Add(encode(f, randomCorpus(rand.New(rand.NewPCG(1, 1)), 12)))
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Read(data)
		if err != nil {
			return
		}
		again, err := Read(encode(t, c))
		if err != nil || !sameCorpus(c, again) {
			t.Fatalf("re-read: %v", err)
		}
	})
}

// Dist is nearest-rank: p50 of 1..100 ms is 50 ms, p99 99 ms, p999 and
// the max 100 ms; no samples, all zero.
func TestDist(t *testing.T) {
	var xs []time.Duration
	for i := 100; i >= 1; i-- {
		xs = append(xs, time.Duration(i)*time.Millisecond)
	}
	d := Dist(xs[:50], xs[50:])
	ms := uint64(time.Millisecond)
	if d.P50 != 50*ms || d.P99 != 99*ms || d.P999 != 100*ms || d.Max != 100*ms {
		t.Fatalf("%+v", d)
	}
	if xs[0] != 100*time.Millisecond {
		t.Fatal("Dist sorted its input")
	}
	if (Dist() != Distribution{}) {
		t.Fatal("no samples")
	}
}
