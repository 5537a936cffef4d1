// Package vllm ingests the KV cache events real vLLM engines publish: the
// msgpack wire format in both its encodings (tagged positional arrays up to
// vLLM 0.23, tagged maps since mid-2026), a converter to kvradix events, a
// ZeroMQ subscriber that repairs gaps through the engines' replay sockets
// and counts every loss it cannot repair, and a vLLM-compatible publisher for
// tests and load.
//
// # Wire format
//
// A live message is three ZeroMQ frames: the topic (UTF-8, empty when
// none; llm-d's convention is kv@<pod>@<model>), an 8-byte big-endian
// sequence number (0 per publisher process, +1 a batch, 0 again after a
// restart) and a msgpack payload, one scheduler step's batch:
//
//   - the envelope is positional in every version, [ts float64, events,
//     data_parallel_rank int|nil] (the first versions sent [ts, events]);
//     vLLM's main branch wraps it in a map {ts, events, data_parallel_rank};
//   - an event is a tagged array [tag, fields...] up to vLLM 0.23, with
//     every field written, nils included, or since mid-2026 a map whose
//     "type" key is the tag and whose nil optional fields are left out;
//     unknown keys are ignored;
//   - BlockStored carries block_hashes (uint64, or bytes), parent_block_hash
//     (nil at the root), token_ids (block_size of them a block), block_size,
//     lora_id, medium ("GPU" from the block pool, "CPU" and others from
//     offload connectors), lora_name, extra_keys, group_idx and the KV cache
//     spec; SGLang puts a metadata map (its cache_salt) where vLLM has
//     lora_name. BlockRemoved carries block_hashes, medium and group_idx;
//     AllBlocksCleared nothing;
//   - RFC #1527's events (Mooncake's master, TokenSpeed) are maps in the
//     array envelope (its timestamp in integer milliseconds), typed by
//     "event_type" (stored, removed, cleared) and naming three fields
//     otherwise: seq_hashes (block_hashes), parent_hash
//     (parent_block_hash) and additional_salt (cache_salt); media come in
//     lower case, block_size and token_ids may be nil, and model_name and
//     tenant_id say whose blocks they are. Mooncake adds vLLM's names
//     beside them by default ("type", "block_hashes", ...): both are read,
//     and must agree.
//
// One publisher runs per data-parallel rank, its ports offset by the rank.
// Its replay socket (a ROUTER) answers an 8-byte big-endian start sequence
// with every batch it still holds from there, in order, then an end marker
// (an all-ones sequence, or an empty last frame); newer vLLMs put the topic
// before each replayed sequence. The hand-derived vectors in testdata/ pin
// each shape.
package vllm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvradix/kvradix/kvevent"
)

// Event types as vLLM tags them.
const (
	BlockStored      = "BlockStored"
	BlockRemoved     = "BlockRemoved"
	AllBlocksCleared = "AllBlocksCleared"
)

// Batch is one decoded payload: vLLM's KVEventBatch.
type Batch struct {
	TS     float64 // publisher's Unix time, seconds
	DPRank *int    // data-parallel rank; nil when absent or nil
	Events []Event
}

// Event is one decoded KV cache event. Fields an event type lacks are zero.
// An event of a type this package does not know keeps its Type and nothing
// else; the converter counts and skips it.
type Event struct {
	Type            string
	BlockHashes     []uint64
	ParentBlockHash *uint64
	TokenIDs        []uint32
	BlockSize       int
	LoRAName        string
	Medium          string // "" when nil
	GroupIdx        int
	KVCacheSpecKind string
	// CacheSalt is the salt of a salted store: SGLang's metadata map (at
	// the array position of vLLM's lora_name), or a map event's
	// cache_salt key.
	CacheSalt string
	// Locality is vLLM's "LOCAL" or "REMOTE" (2026; "" when absent): a
	// REMOTE event speaks of another engine's blocks.
	Locality string
	// RemainingCopies is a BlockRemoved's remaining_copy_counts (vLLM
	// #48933, map events only): for each of BlockHashes, the copies the
	// engine still holds after this removal; nil when absent.
	RemainingCopies []uint32
	// MultimodalAt is 1 + the index of the first block whose extra_keys
	// name a multimodal input (a 64-hex-digit identifier, alone or with
	// its offset: Dynamo's rule) or prompt embeddings (bytes); 0 when none.
	// kvradix does not hash such inputs into a block, so that block and
	// its descendants are not indexed (the converter cuts the store
	// there): a multimodal block would otherwise match its text alone.
	// Other extra keys are the LoRA name (carried by lora_name) and the
	// cache salt (see texts); numbers are ignored.
	MultimodalAt int
	// Ownership is vLLM's ownership (2026, map events; "" when absent):
	// which offload connector's blocks these are. What it means for the
	// engine's own cache is not specified, so an event that has one is
	// dropped and counted, as SMG does.
	Ownership string
	// Origin is a store's origin (vLLM #51699, map events; "" when
	// absent): "NEW", a block newly cached, or "REUSED", one the prefix
	// cache reused and announces again (kv_cache_report_mode=full), which
	// is no new physical copy (see Converter).
	Origin string
	// texts are the first text keys of the first block's extra_keys that
	// name no multimodal input: vLLM sends the request's cache salt there
	// (beside its LoRA name). finish makes the one that is not the LoRA
	// name the event's CacheSalt, unless it has one.
	texts [2][]byte
	// ModelName and TenantID are an RFC #1527 event's model_name and
	// tenant_id ("" when absent or nil): one publisher (Mooncake's master)
	// may speak for several, and an event for another model or tenant
	// than its engine's is not its engine's to index.
	ModelName, TenantID string
	// Err, if set, is why this event did not decode: the batch's other
	// events stand (DecodeBatch also returns the first such error).
	Err error
}

// DecodeError is a malformed payload; it names where: the event (or -1 for
// the envelope) and the field.
type DecodeError struct {
	Event int
	Field string
	Err   error
}

func (e *DecodeError) Error() string {
	if e.Event < 0 {
		return fmt.Sprintf("vllm: envelope: %s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("vllm: event %d: %s: %v", e.Event, e.Field, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// MaxBatchEvents bounds the events of one batch (an engine publishes one
// batch per scheduler step, a few hundred events at most): a header that
// claims more is refused before anything is allocated for them.
const MaxBatchEvents = 1 << 16

// DecodeBatch decodes a payload: the envelope, an array [ts, events,
// data_parallel_rank] (2 or more elements; the rank may be nil or absent)
// or a map {"ts", "events", "data_parallel_rank"} (vLLM without array_like
// on the envelope), and each event in either encoding. Unknown map keys
// and extra trailing elements are ignored. Malformed input is a
// *DecodeError; nothing panics.
//
// An event that does not decode, where its end can still be found, leaves
// the batch standing: it is kept with its Err set, and DecodeBatch returns
// the batch with the first such error, wrapped in ErrBadEvents. Any other
// error (of the envelope, Event -1, or of an event whose end cannot be
// found) loses the whole batch.
func DecodeBatch(payload []byte) (Batch, error) {
	var b Batch
	err := decodeBatchInto(&b, payload)
	return b, err
}

// ErrBadEvents wraps DecodeBatch's error when some events of a batch did
// not decode and the others stand: the batch is to be applied, its bad
// events counted.
var ErrBadEvents = errors.New("vllm: events that did not decode")

func envErr(field string, err error) error { return &DecodeError{Event: -1, Field: field, Err: err} }

func decodeBatchInto(out *Batch, b []byte) error {
	if msgp.NextType(b) == msgp.MapType {
		return decodeMapEnvelope(out, b)
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return envErr("batch", err)
	}
	if n < 2 {
		return envErr("batch", fmt.Errorf("%d elements, want at least 2", n))
	}
	if out.TS, b, err = readTS(b); err != nil {
		return envErr("ts", err)
	}
	var first error // the first event that did not decode
	if b, first, err = decodeEvents(out, b); err != nil {
		return err
	}
	if n >= 3 {
		if out.DPRank, b, err = readRank(b); err != nil {
			return envErr("data_parallel_rank", err)
		}
		for range n - 3 {
			if b, err = msgp.Skip(b); err != nil {
				return envErr("trailing element", err)
			}
		}
	}
	return first
}

// decodeMapEnvelope decodes the map form of the envelope.
func decodeMapEnvelope(out *Batch, b []byte) error {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return envErr("batch", err)
	}
	var first error
	var seen uint8
	for range n {
		var key []byte
		if key, b, err = readStr(b); err != nil {
			return envErr("key", err)
		}
		switch string(key) {
		case "ts":
			seen |= 1
			if out.TS, b, err = readTS(b); err != nil {
				return envErr("ts", err)
			}
		case "events":
			seen |= 2
			if b, first, err = decodeEvents(out, b); err != nil {
				return err
			}
		case "data_parallel_rank":
			if out.DPRank, b, err = readRank(b); err != nil {
				return envErr("data_parallel_rank", err)
			}
		default:
			if b, err = msgp.Skip(b); err != nil {
				return envErr(string(key), err)
			}
		}
	}
	switch {
	case seen&1 == 0:
		return envErr("ts", errors.New("missing"))
	case seen&2 == 0:
		return envErr("events", errors.New("missing"))
	}
	return first
}

// readTS reads the envelope's timestamp: a float, or an integer.
func readTS(b []byte) (float64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.Float64Type, msgp.Float32Type:
		return msgp.ReadFloat64Bytes(b)
	case msgp.IntType, msgp.UintType:
		i, rest, err := msgp.ReadInt64Bytes(b)
		return float64(i), rest, err
	}
	return 0, nil, fmt.Errorf("want a number, got %v", msgp.NextType(b))
}

// readRank reads the envelope's rank: nil, or 0 to kvevent.MaxDPRank.
func readRank(b []byte) (*int, []byte, error) {
	if msgp.IsNil(b) {
		b, err := msgp.ReadNilBytes(b)
		return nil, b, err
	}
	r, b, err := msgp.ReadInt64Bytes(b)
	if err == nil && (r < 0 || r > int64(kvevent.MaxDPRank)) {
		err = fmt.Errorf("%d out of range [0, %d]", r, kvevent.MaxDPRank)
	}
	if err != nil {
		return nil, nil, err
	}
	rank := int(r)
	return &rank, b, nil
}

// decodeEvents decodes the events array into out.Events. An event that
// does not decode is kept with its Err (first reports the first such);
// err is for what loses the batch: a bad array, or an event whose end
// msgp.Skip cannot find.
func decodeEvents(out *Batch, b []byte) (rest []byte, first, err error) {
	ne, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, nil, envErr("events", err)
	}
	if int(ne) > len(b) {
		return nil, nil, envErr("events", msgp.ErrShortBytes)
	}
	if ne > MaxBatchEvents {
		return nil, nil, envErr("events", fmt.Errorf("%d events, more than %d in one batch", ne, MaxBatchEvents))
	}
	out.Events = make([]Event, ne)
	for i := range out.Events {
		next, derr := decodeEvent(&out.Events[i], b, i)
		if derr == nil {
			out.Events[i].finish()
			b = next
			continue
		}
		// Only now look for the event's end: the happy path walks each
		// event once.
		if next, err = msgp.Skip(b); err != nil {
			return nil, nil, derr
		}
		out.Events[i] = Event{Err: derr}
		if first == nil {
			first = fmt.Errorf("%w: %w", ErrBadEvents, derr)
		}
		b = next
	}
	return b, first, nil
}

func evErr(i int, field string, err error) error {
	return &DecodeError{Event: i, Field: field, Err: err}
}

// Field positions of the array encoding, after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func decodeEvent(ev *Event, b []byte, i int) ([]byte, error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		n, rest, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return nil, evErr(i, "event", err)
		}
		if n == 0 {
			return nil, evErr(i, "type", errors.New("empty array, no tag"))
		}
		tag, rest, err := readStr(rest)
		if err == nil && len(tag) == 0 {
			err = errors.New("empty tag")
		}
		if err != nil {
			return nil, evErr(i, "type", err)
		}
		ev.Type = internType(tag)
		var names []string
		switch ev.Type {
		case BlockStored:
			names = storedFields
			if n < 5 {
				return nil, evErr(i, "event", fmt.Errorf("BlockStored with %d fields, want at least 4", n-1))
			}
		case BlockRemoved:
			names = removedFields
			if n < 2 {
				return nil, evErr(i, "event", errors.New("BlockRemoved without block_hashes"))
			}
		}
		for k := 1; k < int(n); k++ {
			if k-1 < len(names) {
				name := names[k-1]
				if name == "lora_name" && msgp.NextType(rest) == msgp.MapType {
					name = "metadata" // SGLang's BlockStoredWithMetadata
				}
				rest, err = ev.field(name, rest, i)
			} else {
				rest, err = msgp.Skip(rest)
			}
			if err != nil {
				return nil, err
			}
		}
		return rest, nil
	case msgp.MapType:
		n, rest, err := msgp.ReadMapHeaderBytes(b)
		if err != nil {
			return nil, evErr(i, "event", err)
		}
		var seen uint16 // which required fields were present
		for range n {
			var key []byte
			key, rest, err = readStr(rest)
			if err != nil {
				return nil, evErr(i, "key", err)
			}
			k := fieldName(key)
			switch k {
			case "type", "event_type":
				rest, err = ev.tag(k, rest, i)
			case "block_hashes", "parent_block_hash", "cache_salt":
				rest, err = ev.once(k, key, &seen, rest, i)
			case "token_ids":
				seen |= 2
				rest, err = ev.field(k, rest, i)
			case "block_size":
				seen |= 4
				rest, err = ev.field(k, rest, i)
			default:
				rest, err = ev.field(k, rest, i)
			}
			if err != nil {
				return nil, err
			}
		}
		switch {
		case ev.Type == "":
			return nil, evErr(i, "type", errors.New("missing (neither type nor event_type)"))
		case ev.Type == BlockStored && seen&1 == 0, ev.Type == BlockRemoved && seen&1 == 0:
			return nil, evErr(i, "block_hashes", errors.New("missing"))
		case ev.Type == BlockStored && seen&2 == 0:
			return nil, evErr(i, "token_ids", errors.New("missing"))
		case ev.Type == BlockStored && seen&4 == 0:
			return nil, evErr(i, "block_size", errors.New("missing"))
		}
		return rest, nil
	}
	return nil, evErr(i, "event", fmt.Errorf("want an array or a map, got %v", msgp.NextType(b)))
}

var fieldNames = []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "cache_salt", "locality", "remaining_copy_counts",
	"event_type", "model_name", "tenant_id", "ownership", "origin"}

// rfcNames are RFC #1527's names (Mooncake's master, TokenSpeed) of the
// fields vLLM names otherwise. Mooncake sends both names by default, with
// the same values.
var rfcNames = map[string]string{"seq_hashes": "block_hashes", "parent_hash": "parent_block_hash", "additional_salt": "cache_salt"}

// fieldName returns the known field name equal to key (vLLM's for an RFC
// #1527 name), or "" (skipped).
func fieldName(key []byte) string {
	for _, n := range fieldNames {
		if string(key) == n {
			return n
		}
	}
	return rfcNames[string(key)]
}

// rfcTypes are RFC #1527's event types.
var rfcTypes = map[string]string{"stored": BlockStored, "removed": BlockRemoved, "cleared": AllBlocksCleared}

// tag reads a map event's type: vLLM's "type" (a tag) or RFC #1527's
// "event_type" (stored, removed, cleared; an unknown one is kept as it is,
// and counted as an unknown type). Given both, they must agree.
func (ev *Event) tag(key string, b []byte, i int) ([]byte, error) {
	tag, b, err := readStr(b)
	if err == nil && len(tag) == 0 {
		err = errors.New("empty tag")
	}
	if err != nil {
		return nil, evErr(i, key, err)
	}
	t, ok := rfcTypes[string(tag)]
	if key != "event_type" || !ok {
		t = internType(tag)
	}
	if ev.Type != "" && ev.Type != t {
		return nil, evErr(i, key, fmt.Errorf("%q disagrees with the event's other type %q", t, ev.Type))
	}
	ev.Type = t
	return b, nil
}

// once reads a field that may come under two names (vLLM's and RFC
// #1527's): the second, if any, must say what the first said.
func (ev *Event) once(name string, key []byte, seen *uint16, b []byte, i int) ([]byte, error) {
	var bit uint16
	switch name {
	case "block_hashes":
		bit = 1
	case "parent_block_hash":
		bit = 8
	default: // cache_salt
		bit = 16
	}
	if *seen&bit == 0 {
		*seen |= bit
		return ev.field(name, b, i)
	}
	var again Event
	b, err := again.field(name, b, i)
	if err != nil {
		return nil, err
	}
	var same bool
	switch name {
	case "block_hashes":
		same = slices.Equal(ev.BlockHashes, again.BlockHashes)
	case "parent_block_hash":
		same = (ev.ParentBlockHash == nil) == (again.ParentBlockHash == nil) && (ev.ParentBlockHash == nil || *ev.ParentBlockHash == *again.ParentBlockHash)
	default:
		same = ev.CacheSalt == again.CacheSalt
	}
	if !same {
		return nil, evErr(i, string(key), fmt.Errorf("disagrees with the event's %s", name))
	}
	return b, nil
}

// field decodes one named field's value into ev; unknown names are skipped.
func (ev *Event) field(name string, b []byte, i int) ([]byte, error) {
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, b, err = readHashes(b, i)
		return b, err
	case "parent_block_hash":
		if msgp.IsNil(b) {
			return msgp.ReadNilBytes(b)
		}
		var h uint64
		h, b, err = readHash(b)
		if err != nil {
			return nil, evErr(i, name, err)
		}
		ev.ParentBlockHash = &h
	case "token_ids":
		if msgp.IsNil(b) {
			return nil, evErr(i, name, errors.New("nil: the index keeps a block by its tokens, so a store without them (as Mooncake's master sends) cannot be placed"))
		}
		ev.TokenIDs, b, err = readTokens(b, i)
		return b, err
	case "block_size":
		if msgp.IsNil(b) { // RFC #1527: unknown, the engine's registered size is taken
			return msgp.ReadNilBytes(b)
		}
		var v int64
		v, b, err = msgp.ReadInt64Bytes(b)
		if err == nil && (v < 0 || v > math.MaxInt32) {
			err = fmt.Errorf("%d out of range", v)
		}
		ev.BlockSize = int(v)
	case "group_idx":
		if msgp.IsNil(b) {
			return msgp.ReadNilBytes(b)
		}
		var v int64
		v, b, err = msgp.ReadInt64Bytes(b)
		if err == nil && (v < math.MinInt32 || v > math.MaxInt32) {
			err = fmt.Errorf("%d out of range", v)
		}
		ev.GroupIdx = int(v)
	case "medium":
		ev.Medium, b, err = readOptStr(b, internMedium)
	case "lora_name":
		ev.LoRAName, b, err = readOptStr(b, nil)
	case "kv_cache_spec_kind":
		ev.KVCacheSpecKind, b, err = readOptStr(b, internMedium)
	case "cache_salt":
		ev.CacheSalt, b, err = readOptStr(b, nil)
	case "locality":
		ev.Locality, b, err = readOptStr(b, internMedium)
	case "extra_keys":
		b, err = ev.extraKeys(b)
	case "model_name":
		ev.ModelName, b, err = readOptStr(b, nil)
	case "tenant_id":
		ev.TenantID, b, err = readOptStr(b, nil)
	case "ownership":
		ev.Ownership, b, err = readOptStr(b, nil)
	case "origin":
		ev.Origin, b, err = readOptStr(b, internMedium)
	case "remaining_copy_counts":
		if msgp.IsNil(b) {
			return msgp.ReadNilBytes(b)
		}
		ev.RemainingCopies, b, err = readCounts(b, i)
		return b, err
	case "metadata":
		b, err = ev.metadata(b, i)
		return b, err
	default:
		b, err = msgp.Skip(b)
	}
	if err != nil {
		return nil, evErr(i, name, err)
	}
	return b, nil
}

// extraKeys reads vLLM's extra_keys, a list aligned with the blocks of
// nil or a list of keys, into MultimodalAt. The position is read by its
// type, as lora_name's is: SGLang's array layout puts its session_id
// there (a string), which is skipped.
func (ev *Event) extraKeys(b []byte) ([]byte, error) {
	if msgp.NextType(b) != msgp.ArrayType {
		return msgp.Skip(b)
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, err
	}
	for j := range n {
		if msgp.IsNil(b) {
			if b, err = msgp.ReadNilBytes(b); err != nil {
				return nil, err
			}
			continue
		}
		var keys uint32
		if keys, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return nil, fmt.Errorf("block %d: %w", j, err)
		}
		for range keys {
			var opaque bool
			var text []byte
			if opaque, text, b, err = extraKey(b); err != nil {
				return nil, fmt.Errorf("block %d: %w", j, err)
			}
			if opaque && ev.MultimodalAt == 0 {
				ev.MultimodalAt = int(j) + 1
			}
			if text != nil && j == 0 {
				if ev.texts[0] == nil {
					ev.texts[0] = text
				} else if ev.texts[1] == nil {
					ev.texts[1] = text
				}
			}
		}
	}
	return b, nil
}

// extraKey reads one extra key: whether it names an input kvradix does
// not hash (a multimodal identifier: 64 hex digits, or an [identifier,
// offset] pair; or prompt embeddings: bytes), or else its text (a LoRA
// name or a cache salt; nil for numbers).
func extraKey(b []byte) (opaque bool, text, rest []byte, err error) {
	switch msgp.NextType(b) {
	case msgp.StrType:
		s, rest, err := msgp.ReadStringZC(b)
		if err != nil || isMMHash(s) {
			return err == nil, nil, rest, err
		}
		return false, s, rest, nil
	case msgp.BinType:
		rest, err := msgp.Skip(b)
		return true, nil, rest, err
	case msgp.ArrayType:
		n, rest, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil || n == 0 {
			return false, nil, rest, err
		}
		mm := msgp.NextType(rest) == msgp.StrType // [identifier, offset]
		for range n {
			if rest, err = msgp.Skip(rest); err != nil {
				return false, nil, nil, err
			}
		}
		return mm, nil, rest, nil
	}
	rest, err = msgp.Skip(b)
	return false, nil, rest, err
}

// finish settles what only the whole event says: vLLM sends a request's
// cache salt among its first block's extra keys, beside its LoRA name, so
// a text key there that is not the LoRA name is the event's salt (unless
// it has one of its own). Blocks of a later event of the same request
// carry no salt and hash unsalted: salted queries miss them, plain ones
// never reach them past the salted first block.
func (ev *Event) finish() {
	for _, t := range ev.texts {
		if t != nil && ev.CacheSalt == "" && string(t) != ev.LoRAName {
			ev.CacheSalt = string(t)
		}
	}
	ev.texts = [2][]byte{}
}

// isMMHash reports whether s is a multimodal identifier as vLLM writes
// one: 64 hex digits.
func isMMHash(s []byte) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// metadata reads SGLang's metadata map ({"cache_salt": str}, other keys
// skipped).
func (ev *Event) metadata(b []byte, i int) ([]byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return nil, evErr(i, "metadata", err)
	}
	for range n {
		var key []byte
		if key, b, err = readStr(b); err != nil {
			return nil, evErr(i, "metadata", err)
		}
		if string(key) == "cache_salt" {
			ev.CacheSalt, b, err = readOptStr(b, nil)
		} else {
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return nil, evErr(i, "metadata."+string(key), err)
		}
	}
	return b, nil
}

func readStr(b []byte) ([]byte, []byte, error) {
	return msgp.ReadStringZC(b)
}

// readOptStr reads a str or nil; intern maps common values to constants so
// they do not allocate.
func readOptStr(b []byte, intern func([]byte) string) (string, []byte, error) {
	if msgp.IsNil(b) {
		b, err := msgp.ReadNilBytes(b)
		return "", b, err
	}
	s, b, err := msgp.ReadStringZC(b)
	if err != nil {
		return "", nil, err
	}
	if intern != nil {
		return intern(s), b, nil
	}
	return string(s), b, nil
}

var knownTypes = []string{BlockStored, BlockRemoved, AllBlocksCleared}

func internType(s []byte) string {
	for _, t := range knownTypes {
		if string(s) == t {
			return t
		}
	}
	return string(s)
}

var knownStrings = []string{"LOCAL", "GPU", "CPU", "DEVICE", "CPU_PINNED", "CPU_TIER1", "CPU_TIER2", "DISK", "NVME", "STORAGE", "EXTERNAL", "NETWORK", "REMOTE", "SHARED", "NEW", "REUSED", "full_attention", "sliding_window", "mla_attention"}

// internMedium returns s, or the known string equal to it but for case:
// vLLM and SGLang send media in capitals, RFC #1527 (Mooncake, TokenSpeed)
// in lower case ("cpu", "disk").
func internMedium(s []byte) string {
	for _, t := range knownStrings {
		if string(s) == t {
			return t
		}
	}
	for _, t := range knownStrings {
		if strings.EqualFold(string(s), t) {
			return t
		}
	}
	return string(s)
}

// readHash reads a block hash: any msgpack integer (signed values are
// reinterpreted as unsigned) or 1 to 32 bytes of bin, of which the last 8,
// big-endian, are the hash.
func readHash(b []byte) (uint64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.UintType:
		return msgp.ReadUint64Bytes(b)
	case msgp.IntType:
		v, rest, err := msgp.ReadInt64Bytes(b)
		return uint64(v), rest, err
	case msgp.BinType:
		raw, rest, err := msgp.ReadBytesZC(b)
		if err != nil {
			return 0, nil, err
		}
		if len(raw) < 1 || len(raw) > 32 {
			return 0, nil, fmt.Errorf("bin hash of %d bytes, want 1 to 32", len(raw))
		}
		var buf [8]byte
		if len(raw) >= 8 {
			copy(buf[:], raw[len(raw)-8:])
		} else {
			copy(buf[8-len(raw):], raw)
		}
		return binary.BigEndian.Uint64(buf[:]), rest, nil
	}
	return 0, nil, fmt.Errorf("want an integer or bin hash, got %v", msgp.NextType(b))
}

func readHashes(b []byte, i int) ([]uint64, []byte, error) {
	return readList(b, i, "block_hashes", readHash)
}

// readCounts reads remaining_copy_counts: each 0 to 2^32-1.
func readCounts(b []byte, i int) ([]uint32, []byte, error) {
	return readList(b, i, "remaining_copy_counts", msgp.ReadUint32Bytes)
}

// readList reads event i's field, an array of at most kvevent.MaxBlocks
// values, each with read; the array's claimed length is checked against
// the bytes left before anything is allocated for it.
func readList[T any](b []byte, i int, field string, read func([]byte) (T, []byte, error)) ([]T, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, nil, evErr(i, field, err)
	}
	if n > kvevent.MaxBlocks {
		return nil, nil, evErr(i, field, kvevent.ErrTooMany)
	}
	if int(n) > len(b) {
		return nil, nil, evErr(i, field, msgp.ErrShortBytes)
	}
	out := make([]T, n)
	for k := range out {
		if out[k], b, err = read(b); err != nil {
			return nil, nil, evErr(i, fmt.Sprintf("%s[%d]", field, k), err)
		}
	}
	return out, b, nil
}

// MaxTokens bounds the token ids of one event: kvevent.MaxBlocks blocks of
// 16 tokens. With MaxBlocks on its block hashes, nothing the subscriber
// accepts is an event kvevent's own decoder would refuse, and one event
// cannot make it allocate more than 64 MiB of token ids.
const MaxTokens = 16 * kvevent.MaxBlocks

var errTooManyTokens = fmt.Errorf("more than %d token ids in one event", MaxTokens)

func readTokens(b []byte, i int) ([]uint32, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, nil, evErr(i, "token_ids", err)
	}
	if n > MaxTokens {
		return nil, nil, evErr(i, "token_ids", errTooManyTokens)
	}
	if int(n) > len(b) {
		return nil, nil, evErr(i, "token_ids", msgp.ErrShortBytes)
	}
	out := make([]uint32, n)
	for k := range out {
		// Fast paths: the unsigned widths msgspec picks for token ids.
		if len(b) >= 5 {
			switch c := b[0]; {
			case c < 0x80:
				out[k], b = uint32(c), b[1:]
				continue
			case c == 0xcc:
				out[k], b = uint32(b[1]), b[2:]
				continue
			case c == 0xcd:
				out[k], b = uint32(binary.BigEndian.Uint16(b[1:])), b[3:]
				continue
			case c == 0xce:
				out[k], b = binary.BigEndian.Uint32(b[1:]), b[5:]
				continue
			}
		}
		var v int64
		if msgp.NextType(b) == msgp.UintType {
			var u uint64
			u, b, err = msgp.ReadUint64Bytes(b)
			v = int64(min(u, math.MaxUint32+1))
		} else {
			v, b, err = msgp.ReadInt64Bytes(b)
		}
		if err == nil && (v < 0 || v > math.MaxUint32) {
			err = fmt.Errorf("token id %d does not fit a u32", v)
		}
		if err != nil {
			return nil, nil, evErr(i, fmt.Sprintf("token_ids[%d]", k), err)
		}
		out[k] = uint32(v)
	}
	return out, b, nil
}
