package hashing_test

import (
	"fmt"

	"github.com/kvradix/kvradix/hashing"
)

// A request's tokens become one local hash per full block (a trailing
// partial block is dropped) and a chain of prefix hashes, as Dynamo's
// kv-router computes them.
func ExampleLocalHashes() {
	tokens := make([]uint32, 40) // two blocks of 16, and 8 tokens left over
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	local := hashing.LocalHashes(nil, tokens, 16, hashing.Options{})
	seq := hashing.SequenceHashes(nil, local)
	fmt.Println(len(local), "blocks")
	fmt.Printf("local %#x %#x\n", local[0], local[1])
	fmt.Println(seq[0] == local[0], seq[1] == hashing.Chain(seq[0], local[1]))

	// A cache salt (or a LoRA adapter) gives the same tokens other hashes,
	// so that they never match an unsalted request's blocks.
	salted := hashing.LocalHashes(nil, tokens, 16, hashing.Options{Salt: "tenant-a"})
	fmt.Println(salted[0] != local[0])
	// Output:
	// 2 blocks
	// local 0xd47a8f41c833328a 0xd43939178abd00db
	// true true
	// true
}
