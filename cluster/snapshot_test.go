package cluster

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// Snapshot events round-trip, and every truncation of a snapshot is an
// error, never a panic or a read past the data.
func TestSnapEventCodec(t *testing.T) {
	evs := []kvevent.RouterEvent{
		{WorkerID: 7, Event: kvevent.Event{DPRank: 2, Data: kvevent.Stored{HasParent: true, ParentHash: 9,
			Blocks: []kvevent.StoredBlock{{BlockHash: 1, TokensHash: 2}, {BlockHash: 3, TokensHash: 4}}}}},
		{WorkerID: 1, Event: kvevent.Event{Data: kvevent.Stored{Blocks: []kvevent.StoredBlock{{BlockHash: 5, TokensHash: 6}}}}},
		{WorkerID: 7, Event: kvevent.Event{DPRank: 2, Data: kvevent.Removed{BlockHashes: []uint64{1, 3}}}},
		{WorkerID: 3, Tier: kvevent.TierHostPinned, Event: kvevent.Event{Data: kvevent.Stored{Blocks: []kvevent.StoredBlock{{BlockHash: 8, TokensHash: 9}}}}},
		{WorkerID: 3, Tier: kvevent.TierExternal, Event: kvevent.Event{Data: kvevent.Removed{BlockHashes: []uint64{8}}}},
	}
	var b []byte
	for _, ev := range evs {
		b = appendSnapEvent(b, ev)
	}
	rest := b
	for i, want := range evs {
		got, r, err := readSnapEvent(rest)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("event %d: %+v (%v), want %+v", i, got, err, want)
		}
		rest = r
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes left", len(rest))
	}
	for n := range len(b) {
		cut := b[:n]
		for len(cut) > 0 {
			var err error
			if _, cut, err = readSnapEvent(cut); err != nil {
				break
			}
		}
	}
	for _, kind := range []byte{9, 0x41} { // an unknown kind; a tier past the last
		if _, _, err := readSnapEvent([]byte{kind, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}); err == nil {
			t.Fatalf("kind byte %#x decoded", kind)
		}
	}
}

// snapFixture is a snapshot of the events above at sequence 41, block
// size 16.
func snapFixture() ([]byte, snapHeader, []kvevent.RouterEvent) {
	evs := []kvevent.RouterEvent{
		{WorkerID: 7, Event: kvevent.Event{DPRank: 2, Data: kvevent.Stored{Blocks: []kvevent.StoredBlock{{BlockHash: 1, TokensHash: 2}, {BlockHash: 3, TokensHash: 4}}}}},
		{WorkerID: 1, Event: kvevent.Event{Data: kvevent.Stored{Blocks: []kvevent.StoredBlock{{BlockHash: 5, TokensHash: 6}}}}},
		{WorkerID: 7, Event: kvevent.Event{DPRank: 2, Data: kvevent.Removed{BlockHashes: []uint64{3}}}},
	}
	var body []byte
	for _, ev := range evs {
		body = appendSnapEvent(body, ev)
	}
	h := snapHeader{seq: 41, blockSize: 16, events: uint64(len(evs)), pairs: 2}
	return encodeSnapshot(h, body), h, evs
}

// A snapshot is taken whole or not at all: every truncation (at an event
// boundary too, and down to the header alone), padding, a changed byte
// anywhere (the header included), an older format and garbage are all
// refused as corruption; the fixture itself decodes to its header.
func TestSnapshotDecodeRefusesDamage(t *testing.T) {
	data, want, _ := snapFixture()
	h, body, err := decodeSnapshot(data)
	want.bodyLen = uint64(len(body))
	if err != nil || h != want || len(body) != len(data)-snapHeaderLen {
		t.Fatalf("fixture: %+v (%v), want %+v", h, err, want)
	}
	refused := func(what string, b []byte) {
		t.Helper()
		if _, _, err := decodeSnapshot(b); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("%s: %v, want ErrCorruptSnapshot", what, err)
		}
	}
	for n := range len(data) {
		refused(fmt.Sprintf("cut to %d bytes", n), data[:n])
	}
	refused("padded", append(slices.Clone(data), 0))
	for i := range data {
		for _, bit := range []byte{1, 0x80} {
			b := slices.Clone(data)
			b[i] ^= bit
			refused(fmt.Sprintf("byte %d flipped by %#x", i, bit), b)
		}
	}
	v1 := slices.Clone(data)
	copy(v1, "KVSNAP1\n")
	if _, _, err := decodeSnapshot(v1); !errors.Is(err, ErrCorruptSnapshot) || !strings.Contains(err.Error(), `format "1"`) {
		t.Fatalf("format 1: %v", err)
	}
	refused("garbage", []byte("not a snapshot at all, but long enough for a header, yes indeed, quite"))
}

// Restore refuses, and applies nothing of, a snapshot that is damaged in
// the bucket, of another block size, or at a sequence past the stream's
// last (seq + 1,000, and 2^63: a replica would wait forever); the whole
// snapshot restores into an indexer of its block size.
func TestRestoreRefusals(t *testing.T) {
	ctx, bus := internalBus(t)
	src := shardpool.NewPool(1, 16)
	defer src.Close()
	r, err := bus.Follow(ctx, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 50 {
		ev := kvevent.RouterEvent{WorkerID: kvevent.WorkerID(i % 3), Event: kvevent.Event{ID: uint64(i) + 1, Data: kvevent.Stored{
			Blocks: []kvevent.StoredBlock{{BlockHash: uint64(1000 + i), TokensHash: uint64(i % 7)}}}}}
		if _, err := bus.Publish(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	seq, err := r.Snapshot(ctx, src.Index())
	if err != nil || seq != 50 {
		t.Fatalf("snapshot at %d (%v), want 50", seq, err)
	}
	good, err := bus.snaps.GetBytes(ctx, snapshotName)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := decodeSnapshot(good)
	if err != nil || h.pairs != uint64(src.Index().Size()) || h.blockSize != 16 {
		t.Fatalf("the written snapshot: %+v (%v)", h, err)
	}
	restore := func(what string, snap []byte, blockSize int, want string) {
		t.Helper()
		if _, err := bus.snaps.PutBytes(ctx, snapshotName, snap); err != nil {
			t.Fatal(err)
		}
		idx := shardpool.NewPool(1, blockSize)
		defer idx.Close()
		_, err := bus.Restore(ctx, idx)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want an error saying %q", what, err, want)
		}
		if n := idx.Index().Size(); n != 0 {
			t.Fatalf("%s: the refused snapshot left %d pairs", what, n)
		}
	}
	flipped := slices.Clone(good)
	flipped[len(flipped)-3] ^= 1
	restore("a flipped byte", flipped, 16, "checksum")
	restore("cut at an event boundary", good[:len(good)-len(appendSnapEvent(nil, lastEvent(t, body)))], 16, "corrupt")
	restore("another block size", good, 32, "block size 16")
	for _, forged := range []uint64{seq + 1000, 1 << 63} {
		fh := h
		fh.seq = forged
		restore(fmt.Sprintf("sequence %d", forged), encodeSnapshot(fh, body), 16, "past the stream's last (50)")
	}
	if _, err := bus.snaps.PutBytes(ctx, snapshotName, good); err != nil {
		t.Fatal(err)
	}
	idx := shardpool.NewPool(2, 16)
	defer idx.Close()
	if from, err := bus.Restore(ctx, idx); err != nil || from != 50 || idx.Index().Size() != src.Index().Size() {
		t.Fatalf("restored at %d with %d pairs (%v), want 50 and %d", from, idx.Index().Size(), err, src.Index().Size())
	}
}

// lastEvent returns the last event of a snapshot body.
func lastEvent(t *testing.T, body []byte) kvevent.RouterEvent {
	t.Helper()
	var ev kvevent.RouterEvent
	for rest := body; len(rest) > 0; {
		var err error
		if ev, rest, err = readSnapEvent(rest); err != nil {
			t.Fatal(err)
		}
	}
	return ev
}

// A bucket whose snapshot's description is gone (damaged on disk) while
// its data is still there is corruption, not "no snapshot" (which would
// make Join start from the stream's start as if nothing had been lost).
func TestSnapshotWithoutItsDescriptionIsCorrupt(t *testing.T) {
	ctx, bus := internalBus(t)
	pool := shardpool.NewPool(1, 16)
	defer pool.Close()
	if _, err := bus.Restore(ctx, pool); err != ErrNoSnapshot {
		t.Fatalf("an empty bucket: %v, want ErrNoSnapshot", err)
	}
	data, _, _ := snapFixture()
	if _, err := bus.snaps.PutBytes(ctx, snapshotName, data); err != nil {
		t.Fatal(err)
	}
	// Drop the object's description (its meta message), keep its chunks.
	stream, err := bus.js.Stream(ctx, "OBJ_"+bus.cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := stream.GetLastMsgForSubject(ctx, "$O."+bus.cfg.Bucket+".M.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, meta.Sequence); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Restore(ctx, pool); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("a snapshot without its description: %v, want ErrCorruptSnapshot", err)
	}
}

// internalBus is an embedded server and a bus on it, for the tests that
// look inside the package; both go at the test's end.
func internalBus(t *testing.T) (context.Context, *Bus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	srv, err := StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	bus, err := Connect(ctx, srv.URL(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Close)
	return ctx, bus
}

// encodeSnapshot is the snapshot of body with header h.
func encodeSnapshot(h snapHeader, body []byte) []byte {
	return putSnapHeader(append(make([]byte, snapHeaderLen), body...), h)
}

// FuzzDecodeSnapshot signs any body with a well-formed header, so that
// the checksum does not stop the fuzzer at the door, and holds the
// decoder to three things: a body that is not whole events, or whose
// events the header miscounts, is ErrCorruptSnapshot; one that is
// decodes to events that encode back to exactly its bytes (each event
// has one encoding); and those events apply to an index, whatever their
// workers, tiers and hashes, with errors at most.
func FuzzDecodeSnapshot(f *testing.F) {
	data, _, _ := snapFixture()
	body := data[snapHeaderLen:]
	f.Add(body, false)
	f.Add(body, true)
	f.Add(body[:len(body)-1], false)
	f.Add([]byte{}, false)
	f.Add(appendSnapEvent(nil, kvevent.RouterEvent{WorkerID: 1 << 62, Tier: kvevent.TierExternal, Event: kvevent.Event{
		Data: kvevent.Stored{HasParent: true, ParentHash: 5}}}), false)
	f.Fuzz(func(t *testing.T, body []byte, miscount bool) {
		n, whole := uint64(0), true
		for rest := body; len(rest) > 0; n++ {
			var err error
			if _, rest, err = readSnapEvent(rest); err != nil {
				whole = false
				break
			}
		}
		h := snapHeader{seq: 3, blockSize: 16, events: n}
		if miscount {
			h.events++
		}
		var got []kvevent.RouterEvent
		seq, bs, err := DecodeSnapshot(encodeSnapshot(h, body), func(ev kvevent.RouterEvent) error {
			got = append(got, ev)
			return nil
		})
		if !whole || miscount {
			if !errors.Is(err, ErrCorruptSnapshot) || got != nil {
				t.Fatalf("whole %v, miscounted %v: %v, %d events applied; want ErrCorruptSnapshot and none", whole, miscount, err, len(got))
			}
			return
		}
		if err != nil || seq != 3 || bs != 16 || uint64(len(got)) != n {
			t.Fatalf("decoded %d of %d events at %d, block size %d: %v", len(got), n, seq, bs, err)
		}
		var again []byte
		for _, ev := range got {
			again = appendSnapEvent(again, ev)
		}
		if !slices.Equal(again, body) {
			t.Fatalf("events encode to\n%x\nnot the body\n%x", again, body)
		}
		pool := shardpool.NewPool(2, 16)
		defer pool.Close()
		for _, ev := range got {
			_ = pool.ApplyEvent(ev)
		}
		if _, err := pool.Flush(); err != nil {
			t.Fatal(err)
		}
	})
}
