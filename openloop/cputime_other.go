//go:build !linux

package openloop

// threadCPU is 0 where the thread's CPU clock is not read.
func threadCPU() int64 { return 0 }
