package lines

import (
	"io"
	"strings"
	"testing"
)

func TestReader(t *testing.T) {
	r := NewReader(strings.NewReader("a\n\n  \n b \r\nlast"), 8)
	for _, want := range []struct {
		text string
		line int
	}{{"a", 1}, {"b", 4}, {"last", 5}} {
		got, err := r.Next()
		if err != nil || string(got) != want.text || r.Line() != want.line {
			t.Fatalf("got %q line %d (%v), want %q line %d", got, r.Line(), err, want.text, want.line)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last line: %v", err)
	}
	long := NewReader(strings.NewReader("ok\n"+strings.Repeat("x", 100)+"\n"), 8)
	long.Next()
	if _, err := long.Next(); err == nil || !strings.Contains(err.Error(), "line 2: longer than 8 bytes") {
		t.Fatalf("long line: %v", err)
	}
	// Lines longer than the bufio buffer are reassembled.
	big := strings.Repeat("y", 200<<10)
	r = NewReader(strings.NewReader(big+"\nz"), 1<<20)
	if got, err := r.Next(); err != nil || len(got) != len(big) {
		t.Fatalf("big line: %d bytes, %v", len(got), err)
	}
}
