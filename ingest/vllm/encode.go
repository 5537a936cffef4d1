package vllm

import (
	"github.com/tinylib/msgp/msgp"
)

// Encoding is how events are written: vLLM's tagged positional arrays (up
// to 0.23) or tagged maps (after vLLM #42892).
type Encoding uint8

const (
	// ArrayEncoding: a positional envelope and events (vLLM up to 0.23,
	// SGLang). A salted store (CacheSalt) without a LoRA name is written as
	// SGLang's BlockStoredWithMetadata; Locality is not written.
	ArrayEncoding Encoding = iota
	// MapEncoding: a positional envelope and tagged-map events (vLLM
	// 0.26 and 0.28).
	MapEncoding
	// MapEnvelopeEncoding: the envelope a map too (vLLM's main, whose
	// EventBatch lost array_like), events tagged maps.
	MapEnvelopeEncoding
)

// String returns "array", "map" or "map-envelope".
func (e Encoding) String() string {
	switch e {
	case MapEncoding:
		return "map"
	case MapEnvelopeEncoding:
		return "map-envelope"
	}
	return "array"
}

// AppendBatch appends the msgpack payload of b as vLLM (msgspec) writes it:
// the envelope positional with every field (or a map, for
// MapEnvelopeEncoding), events in the given encoding; fields vLLM sends
// but kvradix does not model (lora_id, extra_keys,
// kv_cache_spec_sliding_window) are written as nil.
func AppendBatch(dst []byte, b *Batch, enc Encoding) []byte {
	if enc == MapEnvelopeEncoding {
		n := uint32(2)
		if b.DPRank != nil {
			n++ // omit_defaults: a nil rank is left out
		}
		dst = msgp.AppendMapHeader(dst, n)
		dst = msgp.AppendString(dst, "ts")
		dst = msgp.AppendFloat64(dst, b.TS)
		dst = msgp.AppendString(dst, "events")
		dst = appendEvents(dst, b, MapEncoding)
		if b.DPRank != nil {
			dst = msgp.AppendString(dst, "data_parallel_rank")
			dst = msgp.AppendInt(dst, *b.DPRank)
		}
		return dst
	}
	dst = msgp.AppendArrayHeader(dst, 3)
	dst = msgp.AppendFloat64(dst, b.TS)
	dst = appendEvents(dst, b, enc)
	if b.DPRank == nil {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendInt(dst, *b.DPRank)
}

func appendEvents(dst []byte, b *Batch, enc Encoding) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(b.Events)))
	for i := range b.Events {
		dst = appendEvent(dst, &b.Events[i], enc)
	}
	return dst
}

// appendEvent appends one event in the array or map encoding.
func appendEvent(dst []byte, ev *Event, enc Encoding) []byte {
	key := func(name string) {
		if enc == MapEncoding {
			dst = msgp.AppendString(dst, name)
		}
	}
	optStr := func(s string) {
		if s == "" {
			dst = msgp.AppendNil(dst)
		} else {
			dst = msgp.AppendString(dst, s)
		}
	}
	hashes := func() {
		key("block_hashes")
		dst = msgp.AppendArrayHeader(dst, uint32(len(ev.BlockHashes)))
		for _, h := range ev.BlockHashes {
			dst = msgp.AppendUint64(dst, h)
		}
	}
	// The optional keys of map events, omitted when unset.
	extra := func() {
		if enc != MapEncoding {
			return
		}
		if ev.Locality != "" {
			key("locality")
			dst = msgp.AppendString(dst, ev.Locality)
		}
		if ev.CacheSalt != "" && ev.Type == BlockStored {
			key("cache_salt")
			dst = msgp.AppendString(dst, ev.CacheSalt)
		}
		if ev.RemainingCopies != nil && ev.Type == BlockRemoved {
			key("remaining_copy_counts")
			dst = msgp.AppendArrayHeader(dst, uint32(len(ev.RemainingCopies)))
			for _, n := range ev.RemainingCopies {
				dst = msgp.AppendUint32(dst, n)
			}
		}
	}
	extras := func() uint32 {
		n := uint32(0)
		if ev.Locality != "" {
			n++
		}
		if ev.CacheSalt != "" && ev.Type == BlockStored {
			n++
		}
		if ev.RemainingCopies != nil && ev.Type == BlockRemoved {
			n++
		}
		return n
	}
	switch ev.Type {
	case BlockStored:
		if enc == ArrayEncoding && ev.CacheSalt != "" && ev.LoRAName == "" {
			return appendSalted(dst, ev)
		}
		if enc == MapEncoding {
			n := 10 + extras()
			if ev.KVCacheSpecKind != "" {
				n++
			}
			dst = msgp.AppendMapHeader(dst, n)
			key("type")
		} else {
			dst = msgp.AppendArrayHeader(dst, 12)
		}
		dst = msgp.AppendString(dst, ev.Type)
		hashes()
		key("parent_block_hash")
		if ev.ParentBlockHash == nil {
			dst = msgp.AppendNil(dst)
		} else {
			dst = msgp.AppendUint64(dst, *ev.ParentBlockHash)
		}
		key("token_ids")
		dst = msgp.AppendArrayHeader(dst, uint32(len(ev.TokenIDs)))
		for _, t := range ev.TokenIDs {
			dst = msgp.AppendUint32(dst, t)
		}
		key("block_size")
		dst = msgp.AppendInt(dst, ev.BlockSize)
		key("lora_id")
		dst = msgp.AppendNil(dst)
		key("medium")
		optStr(ev.Medium)
		key("lora_name")
		optStr(ev.LoRAName)
		key("extra_keys")
		dst = msgp.AppendArrayHeader(dst, uint32(len(ev.BlockHashes)))
		for range ev.BlockHashes {
			dst = msgp.AppendNil(dst)
		}
		key("group_idx")
		dst = msgp.AppendInt(dst, ev.GroupIdx)
		if enc == ArrayEncoding || ev.KVCacheSpecKind != "" {
			key("kv_cache_spec_kind")
			optStr(ev.KVCacheSpecKind)
		}
		if enc == ArrayEncoding {
			dst = msgp.AppendNil(dst) // kv_cache_spec_sliding_window
		}
		extra()
	case BlockRemoved:
		if enc == MapEncoding {
			dst = msgp.AppendMapHeader(dst, 4+extras())
			key("type")
		} else {
			dst = msgp.AppendArrayHeader(dst, 4)
		}
		dst = msgp.AppendString(dst, ev.Type)
		hashes()
		key("medium")
		optStr(ev.Medium)
		key("group_idx")
		dst = msgp.AppendInt(dst, ev.GroupIdx)
		extra()
	default:
		if enc == MapEncoding {
			dst = msgp.AppendMapHeader(dst, 1)
			key("type")
		} else {
			dst = msgp.AppendArrayHeader(dst, 1)
		}
		dst = msgp.AppendString(dst, ev.Type)
	}
	return dst
}

// appendSalted appends a salted store as SGLang's BlockStoredWithMetadata
// writes it: its seven positional fields, then {"cache_salt": salt}.
func appendSalted(dst []byte, ev *Event) []byte {
	dst = msgp.AppendArrayHeader(dst, 8)
	dst = msgp.AppendString(dst, ev.Type)
	dst = msgp.AppendArrayHeader(dst, uint32(len(ev.BlockHashes)))
	for _, h := range ev.BlockHashes {
		dst = msgp.AppendUint64(dst, h)
	}
	if ev.ParentBlockHash == nil {
		dst = msgp.AppendNil(dst)
	} else {
		dst = msgp.AppendUint64(dst, *ev.ParentBlockHash)
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(ev.TokenIDs)))
	for _, t := range ev.TokenIDs {
		dst = msgp.AppendUint32(dst, t)
	}
	dst = msgp.AppendInt(dst, ev.BlockSize)
	dst = msgp.AppendNil(dst) // lora_id
	if ev.Medium == "" {
		dst = msgp.AppendNil(dst)
	} else {
		dst = msgp.AppendString(dst, ev.Medium)
	}
	dst = msgp.AppendMapHeader(dst, 1)
	dst = msgp.AppendString(dst, "cache_salt")
	return msgp.AppendString(dst, ev.CacheSalt)
}
