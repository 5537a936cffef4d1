package vllm

import (
	"github.com/tinylib/msgp/msgp"
)

// Encoding is how events are written: vLLM's tagged positional arrays (up
// to 0.23) or tagged maps (after vLLM #42892).
type Encoding uint8

const (
	ArrayEncoding Encoding = iota
	MapEncoding
)

// String returns "array" or "map".
func (e Encoding) String() string {
	if e == MapEncoding {
		return "map"
	}
	return "array"
}

// AppendBatch appends the msgpack payload of b as vLLM (msgspec) writes it:
// the envelope always positional with every field, events in the given
// encoding; fields vLLM sends but kvradix does not model (lora_id,
// extra_keys, kv_cache_spec_sliding_window) are written as nil.
func AppendBatch(dst []byte, b *Batch, enc Encoding) []byte {
	dst = msgp.AppendArrayHeader(dst, 3)
	dst = msgp.AppendFloat64(dst, b.TS)
	dst = msgp.AppendArrayHeader(dst, uint32(len(b.Events)))
	for i := range b.Events {
		dst = appendEvent(dst, &b.Events[i], enc)
	}
	if b.DPRank == nil {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendInt(dst, *b.DPRank)
}

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
	switch ev.Type {
	case BlockStored:
		if enc == MapEncoding {
			n := uint32(10)
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
	case BlockRemoved:
		if enc == MapEncoding {
			dst = msgp.AppendMapHeader(dst, 4)
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
