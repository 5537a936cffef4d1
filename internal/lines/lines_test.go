package lines

import (
	"errors"
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
	// An overlong line (longer than the bufio buffer too) is skipped whole:
	// its tail is not taken for the next line, and numbering stays right.
	tail := `{"crafted":"tail"}`
	long := NewReader(strings.NewReader("ok\n"+strings.Repeat("x", 100<<10)+tail+"\nnext\n"), 1<<10)
	long.Next()
	_, err := long.Next()
	var le *Error
	if !errors.As(err, &le) || le.Line != 2 || !errors.Is(err, ErrTooLong) {
		t.Fatalf("long line: %v", err)
	}
	if got, err := long.Next(); err != nil || string(got) != "next" || long.Line() != 3 {
		t.Fatalf("after the long line: %q line %d (%v), want \"next\" line 3", got, long.Line(), err)
	}
	if _, err := long.Next(); err != io.EOF {
		t.Fatalf("at the end: %v", err)
	}
	// An overlong last line without a newline is still one line.
	end := NewReader(strings.NewReader("ok\n"+strings.Repeat("x", 100)), 8)
	end.Next()
	if _, err := end.Next(); !errors.Is(err, ErrTooLong) || end.Line() != 2 {
		t.Fatalf("long last line: %v at line %d", err, end.Line())
	}
	if _, err := end.Next(); err != io.EOF {
		t.Fatalf("after the long last line: %v", err)
	}
	// Lines longer than the bufio buffer are reassembled.
	big := strings.Repeat("y", 200<<10)
	r = NewReader(strings.NewReader(big+"\nz"), 1<<20)
	if got, err := r.Next(); err != nil || len(got) != len(big) {
		t.Fatalf("big line: %d bytes, %v", len(got), err)
	}
}
