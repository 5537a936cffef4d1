package openloop

import (
	"syscall"
	"unsafe"
)

// threadCPU returns the CPU time the calling OS thread has used, in ns
// (CLOCK_THREAD_CPUTIME_ID): a goroutine locked to its thread measures
// itself with it.
func threadCPU() int64 {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return ts.Nano()
}
