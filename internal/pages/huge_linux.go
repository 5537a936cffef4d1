package pages

import (
	"syscall"
	"unsafe"
)

// madvHugepage is Linux's MADV_HUGEPAGE.
const madvHugepage = 14

// hugeSize is the huge page size of x86-64 and arm64 (4 KiB base pages).
const hugeSize = 2 << 20

// adviseHuge asks for transparent huge pages over the 2 MiB pages b
// covers whole. It is a hint: an error (huge pages off, a kernel without
// them) leaves b as it was.
func adviseHuge(b []uint64) {
	if len(b) == 0 {
		return
	}
	base := unsafe.Pointer(unsafe.SliceData(b))
	p := uintptr(base)
	start := (p + hugeSize - 1) &^ (hugeSize - 1)
	end := (p + uintptr(len(b))*8) &^ (hugeSize - 1)
	if end <= start {
		return
	}
	_ = syscall.Madvise(unsafe.Slice((*byte)(unsafe.Add(base, start-p)), end-start), madvHugepage)
}
