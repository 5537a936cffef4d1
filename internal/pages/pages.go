// Package pages makes memory resident before its first use.
package pages

import "runtime"

// pageBytes is a 4 KiB page, the smallest of the systems we run on, and
// pageWords its 8-byte words.
const (
	pageBytes = 4096
	pageWords = pageBytes / 8
)

// Fault makes b resident now rather than at its first writes. It is for
// memory about to be written at random, such as a hash table sized up
// front: there each first touch of a page is a page fault on the hot
// path, and on a virtual machine a fault costs microseconds (about 11 µs a
// 4 KiB page on ours). On Linux it first asks the kernel to fault the
// pages in (MADV_POPULATE_WRITE, changing nothing b holds), then writes a
// word of every page: on our VM the kernel's part then costs 0.6 µs a page
// instead of 5, and the first writes to each page, which a hypervisor
// backing the guest's memory lazily still charges about 5 µs, are taken
// here too. Populated alone, the pages were 2.7 times slower to write at
// random at their first writes (results/README.md). b must be fresh (all
// zeros): Fault writes zeros.
//
// It does not ask for transparent huge pages: on our VM they made the
// table's construction 2-25 times faster but the sustained benchmark a
// quarter slower (results/README.md).
func Fault(b []uint64) {
	populate(b) // where refused, the writes below fault the pages in
	for i := 0; i < len(b); i += pageWords {
		b[i] = 0
	}
}

// Warm makes about n bytes of Go's heap resident ahead of allocations
// that will grow into them: it allocates them in chunks of warmChunk,
// writes a word of every page, and drops them in a collection (runtime.GC,
// which returns their pages to the heap free but resident), so that the
// allocations that follow take no page fault. The runtime places an
// allocation at the lowest free addresses that fit, free pages returned to
// the system or not; chunks fill those first as the allocations after
// them will, where one large allocation would take a range above holes a
// long-running heap leaves (a test's third run faulted in every page it
// wrote after warming so). It is for a structure about to grow by about n
// bytes, made once: the collection blocks the caller. The runtime's
// scavenger returns free memory past its goal (about twice the live heap,
// at GOGC=100) to the system in the background, so Warm is for n within
// what is live already, used soon after.
func Warm(n int) {
	if n <= 0 {
		return
	}
	chunks := make([][]uint64, 0, (n+warmChunk-1)/warmChunk)
	for left := n; left > 0; left -= warmChunk {
		c := make([]uint64, (min(left, warmChunk)+7)/8)
		Fault(c)
		chunks = append(chunks, c)
	}
	runtime.KeepAlive(chunks) // each held until the last is placed
	runtime.GC()
}

// warmChunk is the bytes Warm allocates at a time: a span of its own (past
// Go's 32 KiB of small objects), small enough to fill a heap's holes.
const warmChunk = 64 << 10
