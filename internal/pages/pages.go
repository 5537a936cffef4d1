// Package pages makes memory resident before its first use.
package pages

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

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

// WarmAhead starts Warm(n) in a goroutine of its own, for a structure that
// grows by about n bytes from now on and cannot wait for it: the pages are
// faulted in by another core, where one is idle, and through the kernel,
// at half the cost of the structure's own first writes (see Fault). It
// starts none, and returns false, while a warm it started is running (one
// at a time in a process, whatever asks), where the heap holds n bytes
// free and resident already, or where the process's soft memory limit
// (GOMEMLIMIT) leaves less than n bytes above the memory the runtime
// holds. The warm takes a collection, so it is for growth by steps
// of the same order as what is live, a few times over a structure's life.
func WarmAhead(n int) bool { return warmAhead(n, Warm) }

// warming is set while a warm WarmAhead started runs; started counts them.
var (
	warming atomic.Bool
	started atomic.Int64
)

func warmAhead(n int, warm func(int)) bool {
	if n <= 0 || !worthWarming(n) || !warming.CompareAndSwap(false, true) {
		return false
	}
	started.Add(1)
	go func() {
		defer warming.Store(false)
		warm(n)
	}()
	return true
}

// Warming reports whether a warm WarmAhead started is running.
func Warming() bool { return warming.Load() }

// Started returns how many warms WarmAhead has started in the process.
func Started() int64 { return started.Load() }

// worthWarming reports whether warming n bytes would make pages resident
// that are not, within the soft memory limit if one is set: not where the
// heap holds n bytes free and resident already (a collection would only
// cost), nor where the memory the runtime holds plus n is past the limit.
func worthWarming(n int) bool {
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}, {Name: "/memory/classes/total:bytes"}}
	metrics.Read(s)
	for _, v := range s {
		if v.Value.Kind() != metrics.KindUint64 {
			return false
		}
	}
	if s[0].Value.Uint64() >= uint64(n) {
		return false
	}
	limit := debug.SetMemoryLimit(-1)
	return limit == math.MaxInt64 || s[1].Value.Uint64()+uint64(n) <= uint64(limit)
}
