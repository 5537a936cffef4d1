package pages

import (
	"syscall"
	"unsafe"
)

// madvPopulateWrite is Linux's MADV_POPULATE_WRITE (5.14 and later):
// fault the range in, writable, without changing what it holds.
const madvPopulateWrite = 23

// populate maps b's pages in with one madvise call, from the page holding
// its first word to the one holding its last (pages Go's heap or the
// caller mapped whole, their other bytes left as they are). False if the
// kernel refused (before 5.14, or a range not mapped).
func populate(b []uint64) bool {
	if len(b) == 0 {
		return true
	}
	start := uintptr(unsafe.Pointer(&b[0])) &^ (pageBytes - 1)
	end := uintptr(unsafe.Pointer(&b[len(b)-1])) + 8
	_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, start, end-start, madvPopulateWrite)
	return errno == 0
}
