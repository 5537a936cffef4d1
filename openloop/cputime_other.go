//go:build !linux

package openloop

// threadCPU is 0 where the thread's CPU clock is not read.
func threadCPU() int64 { return 0 }

// processCPU is 0 where the process's CPU time is not read.
func processCPU() int64 { return 0 }
