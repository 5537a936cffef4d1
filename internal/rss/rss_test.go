package rss

import (
	"runtime"
	"testing"
)

// Current and Peak are at least what the process holds now (64 MiB
// touched and kept), in bytes; Peak is at least Current and never falls
// (on Linux).
func TestPeak(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("VmHWM is Linux's")
	}
	before := Peak()
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	now := Current()
	after := Peak()
	if before <= 0 || after < before || after < int64(len(b)) {
		t.Fatalf("peak RSS %d before touching 64 MiB, %d after", before, after)
	}
	if now < int64(len(b)) || now > after {
		t.Fatalf("RSS %d while holding 64 MiB, peak %d", now, after)
	}
	runtime.KeepAlive(b)
}
