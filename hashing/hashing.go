// Package hashing reduces token ids to the 64-bit block hashes the router works with.
//
// A request of n tokens is cut into n/blockSize complete blocks (a trailing
// partial block is dropped, as a KV cache only shares whole blocks). Each block
// gets a local hash over its own tokens ([LocalHashes]); the chained sequence
// hash of block i identifies the whole prefix up to and including block i
// ([SequenceHashes]).
//
// With the default [XXH3] algorithm the hashes are byte-compatible with NVIDIA
// Dynamo's kv-router: XXH3-64 over the block's tokens as little-endian u32
// bytes, seed 1337, and for sequence hashes XXH3-64 over LE64(prev)||LE64(local)
// with the same seed. Events published by Dynamo-based workers therefore carry
// the same tokens hashes kvradix computes.
//
// All functions are append-style: they append to dst and return the extended
// slice, allocating only when dst lacks room, and never per block.
package hashing

import (
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/zeebo/xxh3"
)

// Seed is the base seed of every hash, as in Dynamo's kv-router.
const Seed uint64 = 1337

// Algorithm selects the hash function of local block hashes.
type Algorithm uint8

const (
	// XXH3 is XXH3-64 (github.com/zeebo/xxh3): the default, Dynamo-compatible.
	XXH3 Algorithm = iota
	// XXH64 is XXH64 (github.com/cespare/xxhash/v2). It is NOT compatible
	// with Dynamo: use it only when every party hashes with kvradix.
	XXH64
)

// String returns "xxh3" or "xxh64".
func (a Algorithm) String() string {
	switch a {
	case XXH3:
		return "xxh3"
	case XXH64:
		return "xxh64"
	}
	return "unknown"
}

// Options are the request-wide inputs of local hashing besides the tokens.
// The zero value hashes plain tokens with XXH3, seed 1337.
type Options struct {
	// LoRAName salts every block of a request served by a LoRA adapter;
	// empty means none.
	LoRAName string
	// Salt is a request's cache salt (Dynamo's cache_salt, which it mixes
	// in as its cache namespace; vLLM's and SGLang's cache_salt as they
	// reach the router): blocks stored under a salt never match a request
	// without it, nor one with another. Empty means none. It is mixed in
	// as Dynamo mixes it (SeedFor), so a salted /query hashes as Dynamo's
	// standalone indexer does.
	Salt string
	// MultiModal holds, per block index, the multimodal content hashes that
	// fall into that block. They are appended to the block's bytes as sorted
	// little-endian u64. Blocks beyond len(MultiModal), and nil entries,
	// have none. The slices are not modified.
	MultiModal [][]uint64
	// Algorithm is the hash function; the zero value is XXH3.
	Algorithm Algorithm
}

// SeedFor returns the seed local hashes use under o, Dynamo's salt hash
// (kv-hashing's compute_salt_hash): 1337 + XXH3(LoRAName, seed 0) +
// XXH3(Salt, seed 1), wrapping, where an empty string contributes nothing.
func (o *Options) SeedFor() uint64 {
	seed := Seed
	if o.LoRAName != "" {
		seed += xxh3.HashString(o.LoRAName)
	}
	if o.Salt != "" {
		seed += xxh3.HashStringSeed(o.Salt, 1)
	}
	return seed
}

// littleEndian reports whether the host stores integers little-endian, in
// which case a []uint32 already is the byte string the hash is defined over.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// LocalHashes appends to dst one hash per complete block of tokens and
// returns the extended slice. A blockSize <= 0 appends nothing. It allocates
// only when dst lacks room for len(tokens)/blockSize more hashes (and, for
// blocks with multimodal hashes, once per call when a block's bytes exceed
// 1 KiB).
func LocalHashes(dst []uint64, tokens []uint32, blockSize int, opts Options) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	dst = slices.Grow(dst, n)
	seed := opts.SeedFor()
	if len(opts.MultiModal) == 0 && littleEndian {
		// The hot path: the tokens already are the bytes to hash.
		b := tokenBytes(tokens[:n*blockSize])
		w := 4 * blockSize
		if opts.Algorithm == XXH64 {
			for i := 0; i < len(b); i += w {
				dst = append(dst, xxh64Seed(b[i:i+w], seed))
			}
			return dst
		}
		for i := 0; i < len(b); i += w {
			dst = append(dst, xxh3.HashSeed(b[i:i+w], seed))
		}
		return dst
	}
	// General path: encode each block (plus its sorted multimodal hashes)
	// into one reused buffer and hash it in one go.
	var stack [1024]byte
	buf := stack[:0]
	for i := range n {
		buf = buf[:0]
		for _, t := range tokens[i*blockSize : (i+1)*blockSize] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		if i < len(opts.MultiModal) {
			start := len(buf)
			for _, h := range opts.MultiModal[i] {
				buf = binary.LittleEndian.AppendUint64(buf, h)
			}
			sortU64LE(buf[start:])
		}
		if opts.Algorithm == XXH64 {
			dst = append(dst, xxh64Seed(buf, seed))
		} else {
			dst = append(dst, xxh3.HashSeed(buf, seed))
		}
	}
	return dst
}

// sortU64LE sorts, in place, the little-endian u64 values b is made of
// (insertion sort: a block holds a handful of multimodal items at most).
func sortU64LE(b []byte) {
	for i := 8; i < len(b); i += 8 {
		for j := i; j > 0; j -= 8 {
			x, y := binary.LittleEndian.Uint64(b[j-8:]), binary.LittleEndian.Uint64(b[j:])
			if x <= y {
				break
			}
			binary.LittleEndian.PutUint64(b[j-8:], y)
			binary.LittleEndian.PutUint64(b[j:], x)
		}
	}
}

func xxh64Seed(b []byte, seed uint64) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.Write(b)
	return d.Sum64()
}

// tokenBytes views tokens as their bytes; only valid on little-endian hosts.
func tokenBytes(tokens []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), len(tokens)*4)
}

// SequenceHashes appends to dst the chained prefix hashes of local and
// returns the extended slice: seq[0] = local[0] and
// seq[i] = XXH3-64(LE64(seq[i-1]) || LE64(local[i]), seed 1337).
func SequenceHashes(dst []uint64, local []uint64) []uint64 {
	if len(local) == 0 {
		return dst
	}
	dst = slices.Grow(dst, len(local))
	prev := local[0]
	dst = append(dst, prev)
	for _, l := range local[1:] {
		prev = Chain(prev, l)
		dst = append(dst, prev)
	}
	return dst
}

// Chain returns the sequence hash of a block whose parent has sequence hash
// parent and whose own local hash is local.
func Chain(parent, local uint64) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], parent)
	binary.LittleEndian.PutUint64(buf[8:], local)
	return xxh3.HashSeed(buf[:], Seed)
}
