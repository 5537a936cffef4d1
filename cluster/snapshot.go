package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/shardpool"
)

// snapshotName is the object every snapshot replaces.
const snapshotName = "index"

// A snapshot is a header, then the index's dump as binary events (a fifth
// of the JSON's size). The header is, big endian:
//
//	magic "KVSNAP2\n" (8): the format and its version
//	stream sequence the index reflects (8)
//	block size of the index's hashes (4)
//	events in the body (8)
//	(worker, block) pairs of the index (8)
//	body length in bytes (8)
//	checksum (8): XXH3-64 of the header before it and the whole body
//
// and each event of the body:
//
//	kind (1: Stored, 2: Removed), worker (8), rank (4), then
//	Stored:  has parent (1), parent (8), n (4), n × (engine hash, tokens hash) (16)
//	Removed: n (4), n × engine hash (8)
//
// Restore checks all of it before it applies anything: a snapshot cut
// short, padded, with any byte changed, of another block size or past the
// stream is refused, and the indexer is left as it was.
const (
	snapshotMagic = "KVSNAP2\n"
	snapHeaderLen = 8 + 8 + 4 + 8 + 8 + 8 + 8
)

// ErrSnapshotPastStream is Restore's error for a snapshot at a sequence
// the stream does not reach: forged, or of a stream since re-created
// (Join then starts clean).
var ErrSnapshotPastStream = errors.New("cluster: snapshot past the stream")

// ErrCorruptSnapshot is Restore's error for a snapshot that is not whole:
// not this format, cut short, padded, or failing its checksum.
var ErrCorruptSnapshot = errors.New("cluster: corrupt snapshot")

// snapHeader is a snapshot's header, its checksum aside.
type snapHeader struct {
	seq       uint64
	blockSize uint32
	events    uint64
	pairs     uint64
	bodyLen   uint64
}

// putSnapHeader fills the header of snap, whose first snapHeaderLen bytes
// are reserved for it and the rest is the body, and returns snap.
func putSnapHeader(snap []byte, h snapHeader) []byte {
	body := snap[snapHeaderLen:]
	b := append(snap[:0], snapshotMagic...)
	b = binary.BigEndian.AppendUint64(b, h.seq)
	b = binary.BigEndian.AppendUint32(b, h.blockSize)
	b = binary.BigEndian.AppendUint64(b, h.events)
	b = binary.BigEndian.AppendUint64(b, h.pairs)
	b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	binary.BigEndian.AppendUint64(b, snapChecksum(b, body))
	return snap
}

// snapChecksum is XXH3-64 of the header (without its checksum) and body.
func snapChecksum(header, body []byte) uint64 {
	var x xxh3.Hasher
	_, _ = x.Write(header)
	_, _ = x.Write(body)
	return x.Sum64()
}

// decodeSnapshot checks a snapshot whole (header, length, checksum, every
// event's encoding and their count) and returns its header and body.
func decodeSnapshot(data []byte) (snapHeader, []byte, error) {
	var h snapHeader
	if len(data) < len(snapshotMagic) || string(data[:len(snapshotMagic)-2]) != snapshotMagic[:len(snapshotMagic)-2] {
		return h, nil, fmt.Errorf("%w: not a kvradix snapshot", ErrCorruptSnapshot)
	}
	if string(data[:len(snapshotMagic)]) != snapshotMagic {
		return h, nil, fmt.Errorf("%w: format %q, this reads %q", ErrCorruptSnapshot, data[len(snapshotMagic)-2:len(snapshotMagic)-1], snapshotMagic[len(snapshotMagic)-2:len(snapshotMagic)-1])
	}
	if len(data) < snapHeaderLen {
		return h, nil, fmt.Errorf("%w: %d bytes, shorter than its header", ErrCorruptSnapshot, len(data))
	}
	b := data[len(snapshotMagic):]
	h.seq, h.blockSize = binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:])
	h.events, h.pairs, h.bodyLen = binary.BigEndian.Uint64(b[12:]), binary.BigEndian.Uint64(b[20:]), binary.BigEndian.Uint64(b[28:])
	sum := binary.BigEndian.Uint64(b[36:])
	body := data[snapHeaderLen:]
	if uint64(len(body)) != h.bodyLen {
		return h, nil, fmt.Errorf("%w: body of %d bytes, header says %d", ErrCorruptSnapshot, len(body), h.bodyLen)
	}
	if got := snapChecksum(data[:snapHeaderLen-8], body); got != sum {
		return h, nil, fmt.Errorf("%w: checksum %#x, header says %#x", ErrCorruptSnapshot, got, sum)
	}
	n := uint64(0)
	for rest := body; len(rest) > 0; n++ {
		var err error
		if _, rest, err = readSnapEvent(rest); err != nil {
			return h, nil, fmt.Errorf("%w: event %d: %w", ErrCorruptSnapshot, n, err)
		}
	}
	if n != h.events {
		return h, nil, fmt.Errorf("%w: %d events, header says %d", ErrCorruptSnapshot, n, h.events)
	}
	return h, body, nil
}

// appendSnapEvent appends ev in the snapshot's binary event form. The kind
// byte's high nibble is the event's tier (0, the device's, in every
// snapshot before tiers were kept: those read the same).
func appendSnapEvent(b []byte, ev kvevent.RouterEvent) []byte {
	tier := byte(ev.Tier) << 4
	switch d := ev.Event.Data.(type) {
	case kvevent.Stored:
		b = append(b, 1|tier)
		b = binary.BigEndian.AppendUint64(b, uint64(ev.WorkerID))
		b = binary.BigEndian.AppendUint32(b, uint32(ev.Event.DPRank))
		if d.HasParent {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = binary.BigEndian.AppendUint64(b, d.ParentHash)
		b = binary.BigEndian.AppendUint32(b, uint32(len(d.Blocks)))
		for _, blk := range d.Blocks {
			b = binary.BigEndian.AppendUint64(b, blk.BlockHash)
			b = binary.BigEndian.AppendUint64(b, blk.TokensHash)
		}
	case kvevent.Removed:
		b = append(b, 2|tier)
		b = binary.BigEndian.AppendUint64(b, uint64(ev.WorkerID))
		b = binary.BigEndian.AppendUint32(b, uint32(ev.Event.DPRank))
		b = binary.BigEndian.AppendUint32(b, uint32(len(d.BlockHashes)))
		for _, h := range d.BlockHashes {
			b = binary.BigEndian.AppendUint64(b, h)
		}
	}
	return b
}

var errShortSnapshot = errors.New("truncated event")

// readSnapEvent decodes one event of a snapshot; it never reads past b,
// and takes each event in the one encoding appendSnapEvent writes.
func readSnapEvent(b []byte) (kvevent.RouterEvent, []byte, error) {
	var ev kvevent.RouterEvent
	if len(b) < 13 {
		return ev, nil, errShortSnapshot
	}
	kind, tier := b[0]&0xf, kvevent.Tier(b[0]>>4)
	if tier >= kvevent.NumTiers {
		return ev, nil, fmt.Errorf("unknown tier %d", tier)
	}
	ev.Tier = tier
	ev.WorkerID = kvevent.WorkerID(binary.BigEndian.Uint64(b[1:]))
	ev.Event.DPRank = kvevent.DPRank(binary.BigEndian.Uint32(b[9:]))
	b = b[13:]
	switch kind {
	case 1:
		if len(b) < 13 {
			return ev, nil, errShortSnapshot
		}
		if b[0] > 1 {
			return ev, nil, fmt.Errorf("has-parent byte %d, not 0 or 1", b[0])
		}
		d := kvevent.Stored{HasParent: b[0] == 1, ParentHash: binary.BigEndian.Uint64(b[1:])}
		n := binary.BigEndian.Uint32(b[9:])
		b = b[13:]
		if uint64(len(b)) < 16*uint64(n) {
			return ev, nil, errShortSnapshot
		}
		d.Blocks = make([]kvevent.StoredBlock, n)
		for i := range d.Blocks {
			d.Blocks[i] = kvevent.StoredBlock{BlockHash: binary.BigEndian.Uint64(b[16*i:]), TokensHash: binary.BigEndian.Uint64(b[16*i+8:])}
		}
		ev.Event.Data = d
		return ev, b[16*n:], nil
	case 2:
		if len(b) < 4 {
			return ev, nil, errShortSnapshot
		}
		n := binary.BigEndian.Uint32(b)
		b = b[4:]
		if uint64(len(b)) < 8*uint64(n) {
			return ev, nil, errShortSnapshot
		}
		d := kvevent.Removed{BlockHashes: make([]uint64, n)}
		for i := range d.BlockHashes {
			d.BlockHashes[i] = binary.BigEndian.Uint64(b[8*i:])
		}
		ev.Event.Data = d
		return ev, b[8*n:], nil
	}
	return ev, nil, fmt.Errorf("unknown event kind %d", kind)
}

// Snapshot writes the replica's index, with the stream sequence it
// reflects, to the snapshot bucket. idx must be the index the replica's
// indexer maintains (for a Pool: its Index()); the replica is caught up
// first.
func (r *Replica) Snapshot(ctx context.Context, idx radix.Index) (uint64, error) {
	if err := r.CatchUp(ctx); err != nil {
		return 0, err
	}
	seq := r.seq.Load()
	if _, err := r.b.snaps.PutBytes(ctx, snapshotName, EncodeSnapshot(idx, seq, r.idx.BlockSize())); err != nil {
		return 0, fmt.Errorf("cluster: snapshot at %d: %w", seq, err)
	}
	r.snap.Store(seq)
	return seq, nil
}

// ErrNoSnapshot is Restore's error when the bucket holds none.
var ErrNoSnapshot = errors.New("cluster: no snapshot")

// Restore applies the newest snapshot to idx and returns the stream
// sequence it reflects; Follow from there. The snapshot is checked whole
// first (ErrCorruptSnapshot), and refused if its block size is not idx's
// or its sequence is past the stream's last (a replica following from
// there would wait for events that never come); a refused snapshot
// applies nothing.
func (b *Bus) Restore(ctx context.Context, idx shardpool.Indexer) (uint64, error) {
	data, err := b.snapshot(ctx)
	if err != nil {
		return 0, err
	}
	h, body, err := decodeSnapshot(data)
	if err != nil {
		return 0, err
	}
	if bs := idx.BlockSize(); uint64(h.blockSize) != uint64(bs) {
		return 0, fmt.Errorf("cluster: snapshot of block size %d, the indexer's is %d", h.blockSize, bs)
	}
	last, err := b.LastSeq(ctx)
	if err != nil {
		return 0, err
	}
	if h.seq > last {
		return 0, fmt.Errorf("%w: snapshot at stream sequence %d, past the stream's last (%d)", ErrSnapshotPastStream, h.seq, last)
	}
	for rest := body; len(rest) > 0; {
		var ev kvevent.RouterEvent
		ev, rest, _ = readSnapEvent(rest) // decodeSnapshot read them all
		if err := idx.ApplyEvent(ev); err != nil {
			return 0, err
		}
	}
	if _, err := idx.Flush(); err != nil {
		return 0, err
	}
	return h.seq, nil
}

// EncodeSnapshot returns idx's snapshot in this package's format (see
// snapshotMagic), at stream sequence seq: for a store of its own, such as
// the service's state directory.
func EncodeSnapshot(idx radix.Index, seq uint64, blockSize int) []byte {
	pairs := idx.Size()
	// A dump is mostly one single-block Stored event a pair: sized for
	// those, the body is written once, not copied as it grows, and the
	// header is filled in front of it.
	b := make([]byte, snapHeaderLen, snapHeaderLen+storedEventLen*pairs*9/8)
	events := uint64(0)
	radix.DumpEach(idx, func(ev kvevent.RouterEvent) {
		b = appendSnapEvent(b, ev)
		events++
	})
	return putSnapHeader(b, snapHeader{seq: seq, blockSize: uint32(blockSize), events: events, pairs: uint64(pairs)})
}

// storedEventLen is the bytes of a single-block Stored event in a
// snapshot (appendSnapEvent).
const storedEventLen = 1 + 8 + 4 + 1 + 8 + 4 + 16

// DecodeSnapshot checks a snapshot whole (ErrCorruptSnapshot), then hands
// its events, in order, to apply; it returns the stream sequence and the
// block size its header records. Nothing is applied from a snapshot that
// does not check out.
func DecodeSnapshot(data []byte, apply func(kvevent.RouterEvent) error) (seq uint64, blockSize int, err error) {
	h, body, err := decodeSnapshot(data)
	if err != nil {
		return 0, 0, err
	}
	for rest := body; len(rest) > 0; {
		var ev kvevent.RouterEvent
		ev, rest, _ = readSnapEvent(rest) // decodeSnapshot read them all
		if err := apply(ev); err != nil {
			return 0, 0, err
		}
	}
	return h.seq, int(h.blockSize), nil
}
