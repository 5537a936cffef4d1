package hashing

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/zeebo/xxh3"
)

// Reference vectors from Dynamo's kv-router tests (block size 4).
const (
	dynamoBlock1 = 14643705804678351452 // [1,2,3,4]
	dynamoBlock2 = 16777012769546811212 // [5,6,7,8]
	dynamoChain2 = 4945711292740353085  // sequence hash of the second block
)

func TestDynamoVectors(t *testing.T) {
	local := LocalHashes(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 4, Options{})
	if want := []uint64{dynamoBlock1, dynamoBlock2}; !slices.Equal(local, want) {
		t.Fatalf("LocalHashes = %v, want %v (trailing partial block dropped)", local, want)
	}
	seq := SequenceHashes(nil, local)
	if want := []uint64{dynamoBlock1, dynamoChain2}; !slices.Equal(seq, want) {
		t.Fatalf("SequenceHashes = %v, want %v", seq, want)
	}
}

func leBytes(tokens []uint32) []byte {
	var b []byte
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return b
}

func TestLocalHashes(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	lora := xxh3.HashString("adapter")
	ns := xxh3.HashStringSeed("tenant", 1)
	mmBytes := append(leBytes(tokens[:4]), binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 3), 9)...)
	tests := []struct {
		name      string
		tokens    []uint32
		blockSize int
		opts      Options
		want      []uint64
	}{
		{"zero block size", tokens, 0, Options{}, nil},
		{"negative block size", tokens, -4, Options{}, nil},
		{"shorter than a block", tokens[:3], 4, Options{}, nil},
		{"empty", nil, 4, Options{}, nil},
		{"one token blocks", tokens[:2], 1, Options{}, []uint64{xxh3.HashSeed(leBytes(tokens[:1]), Seed), xxh3.HashSeed(leBytes(tokens[1:2]), Seed)}},
		{"lora salt", tokens[:4], 4, Options{LoRAName: "adapter"}, []uint64{xxh3.HashSeed(leBytes(tokens[:4]), Seed+lora)}},
		{"cache salt (Dynamo's cache namespace)", tokens[:4], 4, Options{Salt: "tenant"}, []uint64{xxh3.HashSeed(leBytes(tokens[:4]), Seed+ns)}},
		{"both salts wrap", tokens[:4], 4, Options{LoRAName: "adapter", Salt: "tenant"}, []uint64{xxh3.HashSeed(leBytes(tokens[:4]), Seed+lora+ns)}},
		{"multimodal sorted", tokens[:4], 4, Options{MultiModal: [][]uint64{{9, 3}}}, []uint64{xxh3.HashSeed(mmBytes, Seed)}},
		{"multimodal on second block only", tokens, 4, Options{MultiModal: [][]uint64{nil, {7}}}, []uint64{dynamoBlock1, xxh3.HashSeed(append(leBytes(tokens[4:]), binary.LittleEndian.AppendUint64(nil, 7)...), Seed)}},
		{"xxh64", tokens[:4], 4, Options{Algorithm: XXH64}, []uint64{xxhashSeed(leBytes(tokens[:4]), Seed)}},
		{"xxh64 multimodal", tokens[:4], 4, Options{Algorithm: XXH64, MultiModal: [][]uint64{{9, 3}}}, []uint64{xxhashSeed(mmBytes, Seed)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := LocalHashes(nil, tc.tokens, tc.blockSize, tc.opts)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func xxhashSeed(b []byte, seed uint64) uint64 {
	d := xxhash.NewWithSeed(seed)
	_, _ = d.Write(b)
	return d.Sum64()
}

func TestMultiModalInputNotModified(t *testing.T) {
	mm := []uint64{9, 3, 5}
	LocalHashes(nil, []uint32{1, 2, 3, 4}, 4, Options{MultiModal: [][]uint64{mm}})
	if !slices.Equal(mm, []uint64{9, 3, 5}) {
		t.Fatalf("multimodal hashes reordered: %v", mm)
	}
}

func TestAppendKeepsPrefix(t *testing.T) {
	dst := []uint64{42}
	got := LocalHashes(dst, []uint32{1, 2, 3, 4}, 4, Options{})
	if !slices.Equal(got, []uint64{42, dynamoBlock1}) {
		t.Fatalf("got %v", got)
	}
	got = SequenceHashes(got[:1], []uint64{dynamoBlock1, dynamoBlock2})
	if !slices.Equal(got, []uint64{42, dynamoBlock1, dynamoChain2}) {
		t.Fatalf("got %v", got)
	}
	if SequenceHashes(nil, nil) != nil {
		t.Fatal("SequenceHashes of nothing should append nothing")
	}
}

func TestNoAllocationsWithRoom(t *testing.T) {
	tokens := make([]uint32, 64*16)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	dst := make([]uint64, 0, 64)
	seq := make([]uint64, 0, 64)
	for _, alg := range []Algorithm{XXH3, XXH64} {
		opts := Options{Algorithm: alg, LoRAName: "x", MultiModal: [][]uint64{{1, 2}}}
		allocs := testing.AllocsPerRun(100, func() {
			dst = LocalHashes(dst[:0], tokens, 16, opts)
			seq = SequenceHashes(seq[:0], dst)
		})
		if allocs != 0 {
			t.Errorf("%v: %v allocations per call, want 0", alg, allocs)
		}
	}
}

func TestAlgorithmString(t *testing.T) {
	for a, want := range map[Algorithm]string{XXH3: "xxh3", XXH64: "xxh64", 9: "unknown"} {
		if a.String() != want {
			t.Errorf("%d: %q", a, a.String())
		}
	}
}

// FuzzLocalHashes checks that block hashing is a function of each block
// alone: hashing a whole prompt equals hashing its blocks one at a time, a
// prefix of the tokens gives a prefix of the hashes, and chaining agrees with
// Chain applied step by step.
func FuzzLocalHashes(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, uint8(4), "", false)
	f.Add([]byte{}, uint8(0), "lora", true)
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, lora string, x64 bool) {
		tokens := make([]uint32, len(raw)/2)
		for i := range tokens {
			tokens[i] = uint32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
		opts := Options{LoRAName: lora}
		if x64 {
			opts.Algorithm = XXH64
		}
		blockSize := int(bs%17) - 1 // -1..15 exercises misuse too
		all := LocalHashes(nil, tokens, blockSize, opts)
		if blockSize <= 0 {
			if len(all) != 0 {
				t.Fatalf("block size %d gave %d hashes", blockSize, len(all))
			}
			return
		}
		if len(all) != len(tokens)/blockSize {
			t.Fatalf("%d hashes for %d tokens of block size %d", len(all), len(tokens), blockSize)
		}
		for i, h := range all {
			one := LocalHashes(nil, tokens[i*blockSize:(i+1)*blockSize], blockSize, opts)
			if len(one) != 1 || one[0] != h {
				t.Fatalf("block %d: %v alone, %x in the whole", i, one, h)
			}
		}
		seq := SequenceHashes(nil, all)
		for i := 1; i < len(seq); i++ {
			if seq[i] != Chain(seq[i-1], all[i]) {
				t.Fatalf("sequence hash %d is not chained", i)
			}
		}
	})
}
