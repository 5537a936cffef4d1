package rss

import (
	"runtime"
	"testing"
)

// Peak is at least what the process holds now (64 MiB touched and kept),
// in bytes, and never falls (on Linux).
func TestPeak(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("VmHWM is Linux's")
	}
	before := Peak()
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	after := Peak()
	if before <= 0 || after < before || after < int64(len(b)) {
		t.Fatalf("peak RSS %d before touching 64 MiB, %d after", before, after)
	}
	runtime.KeepAlive(b)
}
