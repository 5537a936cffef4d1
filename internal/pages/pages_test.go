package pages

import (
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/kvradix/kvradix/internal/rss"
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
	const size = 64 << 20
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	b := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), size/8)
	before := rss.Current()
	Fault(b)
	if grown := rss.Current() - before; grown < size*9/10 {
		t.Fatalf("after Fault the resident set grew by %d MiB, want about %d", grown>>20, size>>20)
	}
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
