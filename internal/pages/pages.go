// Package pages makes memory resident before its first use.
package pages

// pageWords is the 8-byte words in a 4 KiB page, the smallest page of
// the systems we run on.
const pageWords = 4096 / 8

// Fault makes b resident now rather than at its first writes: where the
// system allows it (Linux with transparent_hugepage set to madvise or
// always) it asks for huge pages over b's whole 2 MiB pages, then writes a
// word of every 4 KiB page. b must be fresh (all zeros): Fault writes
// zeros. It is for memory about to be written at random, such as a hash
// table sized up front: there each first touch of a page is a page fault
// on the hot path, and on a virtual machine a fault costs microseconds
// (12 µs a 4 KiB page on ours, results/README.md), where faulting a huge
// page at once costs little more than zeroing it.
func Fault(b []uint64) {
	adviseHuge(b)
	for i := 0; i < len(b); i += pageWords {
		b[i] = 0
	}
}
