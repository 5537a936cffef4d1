package pages

import (
	"runtime"
	"testing"

	"github.com/kvradix/kvradix/internal/rss"
)

// Fault makes fresh memory resident before it is written: the resident
// set grows by (almost) the whole slice, which a plain allocation does
// not do until its pages are touched. It writes only zeros, and takes
// slices shorter than a page, empty, or not aligned to one.
func TestFault(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the resident set is read from /proc")
	}
	const size = 64 << 20
	before := rss.Current()
	b := make([]uint64, size/8)
	if grown := rss.Current() - before; grown > size/2 {
		t.Fatalf("a fresh allocation of %d MiB is %d MiB resident before Fault: the test cannot see Fault", size>>20, grown>>20)
	}
	Fault(b)
	if grown := rss.Current() - before; grown < size*9/10 {
		t.Fatalf("after Fault the resident set grew by %d MiB, want about %d", grown>>20, size>>20)
	}
	for _, n := range []int{0, 1, 511, 513} {
		c := make([]uint64, n)
		Fault(c)
		for i, w := range c {
			if w != 0 {
				t.Fatalf("Fault of %d words wrote %d at %d", n, w, i)
			}
		}
	}
	odd := make([]uint64, 3<<18+7)
	Fault(odd[5:])
	runtime.KeepAlive(b)
}
