// Package rss reads the process's resident set size and CPU time, and the
// machine's CPU time.
package rss

import (
	"os"
	"strconv"
	"strings"
)

// Peak returns the process's peak resident set (VmHWM) in bytes; 0 where
// /proc/self/status does not say (not Linux).
func Peak() int64 { return status("VmHWM:") }

// Current returns the process's resident set now (VmRSS) in bytes; 0
// where /proc/self/status does not say.
func Current() int64 { return status("VmRSS:") }

// status reads a size in kB from /proc/self/status.
func status(key string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, key); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
