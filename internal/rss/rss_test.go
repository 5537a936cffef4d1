package rss

import (
	"runtime"
	"testing"
)

// Peak grows with what the process touches (on Linux).
func TestPeak(t *testing.T) {
	before := Peak()
	if runtime.GOOS != "linux" {
		t.Skip("VmHWM is Linux's")
	}
	if before <= 0 {
		t.Fatalf("peak RSS %d", before)
	}
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	if after := Peak(); after < before+32<<20 {
		t.Fatalf("peak RSS %d after touching 64 MiB, %d before", after, before)
	}
	runtime.KeepAlive(b)
}
