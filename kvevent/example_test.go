package kvevent_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvradix/kvradix/kvevent"
)

// A JSON Lines stream of Dynamo's RouterEvents decodes event by event; a
// malformed line is an error naming the line and the field.
func ExampleReader() {
	stream := `{"worker_id":7,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":11,"tokens_hash":22},{"block_hash":12,"tokens_hash":23}]}},"dp_rank":0}}
{"worker_id":7,"storage_tier":"host_pinned","event":{"event_id":2,"data":{"removed":{"block_hashes":[12]}},"dp_rank":0}}
{"worker_id":7,"event":{"event_id":3,"data":{"stored":{"parent_hash":11,"blocks":[{"block_hash":"x"}]}},"dp_rank":0}}
`
	r := kvevent.NewReader(strings.NewReader(stream))
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Println("error:", err)
			break
		}
		switch d := ev.Event.Data.(type) {
		case kvevent.Stored:
			fmt.Printf("worker %d stored %d blocks in tier %v\n", ev.WorkerID, len(d.Blocks), ev.Tier)
		case kvevent.Removed:
			fmt.Printf("worker %d removed %v from tier %v\n", ev.WorkerID, d.BlockHashes, ev.Tier)
		}
	}
	// Output:
	// worker 7 stored 2 blocks in tier device
	// worker 7 removed [12] from tier host_pinned
	// error: line 3: event.data.stored.blocks[0].block_hash: cannot use a string as uint64
}

// A Writer encodes events as Dynamo's JSON, one a line.
func ExampleWriter() {
	w := kvevent.NewWriter(os.Stdout)
	ev := kvevent.RouterEvent{WorkerID: 7, Event: kvevent.Event{ID: 1, Data: kvevent.Stored{
		HasParent: true, ParentHash: 11,
		Blocks: []kvevent.StoredBlock{{BlockHash: 12, TokensHash: 23}},
	}}}
	if err := w.Write(&ev); err != nil {
		fmt.Println(err)
	}
	if err := w.Flush(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// {"worker_id":7,"storage_tier":"device","event":{"event_id":1,"data":{"stored":{"parent_hash":11,"blocks":[{"block_hash":12,"tokens_hash":23}]}},"dp_rank":0}}
}
