package pages

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kvradix/kvradix/internal/rss"
	"github.com/kvradix/kvradix/internal/testwait"
)

// Fault makes fresh memory resident before it is written: the resident
// set grows by (almost) the whole slice, which fresh memory does not do
// until its pages are touched. It writes only zeros, and takes slices
// shorter than a page, empty, or not aligned to one. The memory is mapped
// for the test, not taken from Go's heap, so that it is fresh however
// often the test runs (the heap may hand back pages a run made resident).
func TestFault(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the resident set is read from /proc")
	}
	b := growsResident(t, 64<<20, Fault)
	odd := make([]uint64, 3<<18+7)
	for _, c := range [][]uint64{b, make([]uint64, 0), make([]uint64, 1), make([]uint64, 511), make([]uint64, 513), odd[5:]} {
		Fault(c)
		for i, w := range c {
			if w != 0 {
				t.Fatalf("Fault of %d words wrote %d at %d", len(c), w, i)
			}
		}
	}
}

// Warm leaves the heap it warms resident for the allocations that follow:
// with the free heap returned to the system first, 32 MiB allocated and
// written page by page fault in (nearly) every page, and after Warm of 48
// MiB, few. A live 64 MiB keeps the runtime's goal above what Warm leaves
// free, as a sized tree's table does, or the scavenger would return it.
func TestWarm(t *testing.T) {
	if runtime.GOOS != "linux" || raceEnabled {
		t.Skip("page faults are read from getrusage, and counted without the race detector")
	}
	const size, parts = 32 << 20, 32
	live := make([]uint64, 64<<20/8)
	Fault(live)
	defer runtime.KeepAlive(live)
	faults := func(warm bool) int64 {
		debug.FreeOSMemory()
		if warm {
			Warm(size * 3 / 2)
		}
		before := rss.Process().Faults
		bufs := make([][]uint64, parts)
		for i := range bufs {
			bufs[i] = make([]uint64, size/parts/8)
			Fault(bufs[i])
		}
		n := rss.Process().Faults - before
		runtime.KeepAlive(bufs)
		return n
	}
	const pages = size / 4096
	if cold := faults(false); cold < pages*3/4 {
		t.Skipf("%d MiB written fault in %d pages of %d without Warm: this system does not fault in fresh heap", size>>20, cold, pages)
	}
	if warm := faults(true); warm > pages/4 {
		t.Fatalf("%d MiB written after Warm fault in %d pages of %d, want few", size>>20, warm, pages)
	}
}

// WarmAhead starts one warm at a time in the process, in a goroutine of
// its own, with the bytes it was asked for, and none where it would only
// cost: nothing to warm, the heap's free pages resident already, or the
// soft memory limit too close.
func TestWarmAhead(t *testing.T) {
	release, got := make(chan struct{}), make(chan int, 2)
	blocked := func(n int) { got <- n; <-release }
	debug.FreeOSMemory() // the heap's free pages released: worth warming
	before := Started()
	const n = 8 << 20
	if !warmAhead(n, blocked) {
		t.Fatal("refused with the heap's free pages released")
	}
	if !Warming() {
		t.Fatal("not warming after a warm started")
	}
	if warmAhead(n, blocked) {
		t.Fatal("a second warm started while the first ran")
	}
	if m := <-got; m != n {
		t.Fatalf("warmed %d bytes, want %d", m, n)
	}
	close(release)
	testwait.For(t, "the warm to end", func() bool { return !Warming() })
	if s := Started() - before; s != 1 {
		t.Fatalf("%d warms started, want 1", s)
	}
	for _, m := range []int{0, -1} {
		if warmAhead(m, blocked) {
			t.Fatalf("a warm of %d bytes started", m)
		}
	}

	// 64 MiB free and resident (a live 128 MiB keeps the scavenger's goal
	// above them, as in TestWarm): a warm of 32 MiB has nothing to do.
	live := make([]uint64, 128<<20/8)
	Fault(live)
	defer runtime.KeepAlive(live)
	spare := make([]uint64, 64<<20/8)
	Fault(spare)
	runtime.KeepAlive(spare)
	spare = nil
	runtime.GC()
	if warmAhead(32<<20, blocked) {
		t.Fatal("a warm of 32 MiB started with 64 MiB of the heap free and resident")
	}

	debug.FreeOSMemory()
	total := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(total)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(int64(total[0].Value.Uint64()) + 16<<20))
	if warmAhead(64<<20, blocked) {
		t.Fatal("a warm of 64 MiB started 16 MiB under the soft memory limit")
	}
}

// populate has the kernel fault pages in, leaving what they hold: a slice
// of non-zero words, not aligned to a page, comes out unchanged and the
// pages of fresh memory resident.
func TestPopulate(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("MADV_POPULATE_WRITE is Linux's")
	}
	b := growsResident(t, 16<<20, func(b []uint64) {
		b[3] = 7
		if !populate(b[3 : len(b)-5]) {
			t.Skip("the kernel refused MADV_POPULATE_WRITE (before 5.14?)")
		}
	})
	if b[3] != 7 {
		t.Fatalf("word 3 is %d after populate, want 7", b[3])
	}
	b[3] = 0
	if i := slices.IndexFunc(b, func(w uint64) bool { return w != 0 }); i >= 0 {
		t.Fatalf("word %d is %d after populate, want 0", i, b[i])
	}
}

// BenchmarkPrepare makes 64 MiB of fresh memory resident each way, then
// writes it at random: prepare-us/page is the way's cost a page, and
// write-ns the first random writes' a write (a 4 KiB page takes about 16).
// On our VM a touch costs ~11 µs a page, a populate alone ~0.6 but leaves
// the writes 2.7 times slower (the hypervisor backs each page at its first
// write), and both (Fault) ~5.4, the writes at full speed.
func BenchmarkPrepare(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("MADV_POPULATE_WRITE is Linux's")
	}
	const size, writes = 64 << 20, 4 << 20
	for _, way := range []string{"touch", "populate", "fault"} {
		b.Run("way="+way, func(b *testing.B) {
			var prep, wr time.Duration
			for b.Loop() {
				w, unmap := mapFresh(b, size)
				start := time.Now()
				if !prepareWay(way, w) {
					b.Skip("the kernel refused MADV_POPULATE_WRITE")
				}
				prep += time.Since(start)
				start = time.Now()
				x := uint64(12345)
				for range writes {
					x = x*6364136223846793005 + 1442695040888963407
					w[x>>20%uint64(len(w))]++
				}
				wr += time.Since(start)
				unmap()
			}
			b.ReportMetric(float64(prep.Microseconds())/float64(b.N)/(size/pageBytes), "prepare-us/page")
			b.ReportMetric(float64(wr.Nanoseconds())/float64(b.N)/writes, "write-ns")
		})
	}
}

// BenchmarkFaultThreads makes 64 MiB of fresh memory resident by
// threads=1 or 2 goroutines at once, each its own share, at GOMAXPROCS 2
// either way, by way=touch (a write a page, as Go's heap is first
// written) or way=fault (Fault): us/page is the wall time a page, so two
// threads that fault in parallel halve it. On our VM two threads take
// 0.55 of one's time a page, either way (results/fresh-store-cpu.txt):
// first touches overlap across the vCPUs when nothing else runs.
func BenchmarkFaultThreads(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("MADV_POPULATE_WRITE is Linux's")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	for _, way := range []string{"touch", "fault"} {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("way=%s/threads=%d", way, threads), func(b *testing.B) { faultThreads(b, way, threads) })
		}
	}
}

// faultThreads is one of BenchmarkFaultThreads's ways, with threads
// goroutines.
func faultThreads(b *testing.B, way string, threads int) {
	const size = 64 << 20
	var took time.Duration
	for b.Loop() {
		shares := make([][]uint64, threads)
		unmaps := make([]func(), threads)
		for i := range shares {
			shares[i], unmaps[i] = mapFresh(b, size/threads)
		}
		var wg sync.WaitGroup
		start := time.Now()
		for _, w := range shares {
			wg.Go(func() { prepareWay(way, w) })
		}
		wg.Wait()
		took += time.Since(start)
		for _, unmap := range unmaps {
			unmap()
		}
	}
	b.ReportMetric(float64(took.Nanoseconds())/1e3/float64(b.N)/(size/pageBytes), "us/page")
}

// prepareWay makes w resident by way: touch (a zero written a page),
// populate (populate alone) or fault (Fault); false if the kernel refused
// to populate.
func prepareWay(way string, w []uint64) bool {
	switch way {
	case "populate":
		return populate(w)
	case "fault":
		Fault(w)
	default:
		for i := 0; i < len(w); i += pageWords {
			w[i] = 0
		}
	}
	return true
}

// mapFresh maps size bytes of fresh memory, outside Go's heap (which may
// hand back pages an earlier run made resident), and returns them with
// the function that unmaps them.
func mapFresh(tb testing.TB, size int) (w []uint64, unmap func()) {
	tb.Helper()
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		tb.Fatal(err)
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), size/8), func() {
		if err := syscall.Munmap(mem); err != nil {
			tb.Fatal(err)
		}
	}
}

// growsResident maps size bytes of fresh memory for the test, and checks
// that prepare makes (nearly) all of it resident.
func growsResident(t *testing.T, size int, prepare func([]uint64)) []uint64 {
	t.Helper()
	b, unmap := mapFresh(t, size)
	t.Cleanup(unmap)
	before := rss.Current()
	prepare(b)
	if grown := rss.Current() - before; grown < int64(size)*9/10 {
		t.Fatalf("the resident set grew by %d MiB, want about %d", grown>>20, size>>20)
	}
	return b
}
