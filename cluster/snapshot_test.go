package cluster

import (
	"reflect"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
)

// Snapshot events round-trip, and every truncation of a snapshot is an
// error, never a panic or a read past the data.
func TestSnapEventCodec(t *testing.T) {
	evs := []kvevent.RouterEvent{
		{WorkerID: 7, Event: kvevent.Event{DPRank: 2, Data: kvevent.Stored{HasParent: true, ParentHash: 9,
			Blocks: []kvevent.StoredBlock{{BlockHash: 1, TokensHash: 2}, {BlockHash: 3, TokensHash: 4}}}}},
		{WorkerID: 1, Event: kvevent.Event{Data: kvevent.Stored{Blocks: []kvevent.StoredBlock{{BlockHash: 5, TokensHash: 6}}}}},
		{WorkerID: 7, Event: kvevent.Event{DPRank: 2, Data: kvevent.Removed{BlockHashes: []uint64{1, 3}}}},
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
	if _, _, err := readSnapEvent([]byte{9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}); err == nil {
		t.Fatal("an unknown kind decoded")
	}
}
