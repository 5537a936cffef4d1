package lines

import (
	"bytes"
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

// FuzzReader checks the reader against splitting the input by hand: every
// line over the bound is one *Error with its own number, every other
// non-blank line comes back trimmed, in order, with its number.
func FuzzReader(f *testing.F) {
	f.Add([]byte("a\n\nb\r\n"), 8)
	f.Add([]byte("ok\n"+strings.Repeat("x", 40)+`{"tail":1}`+"\nnext"), 16)
	f.Add([]byte(strings.Repeat("y", 100)), 4)
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		max = 1 + max&0xff
		r := NewReader(bytes.NewReader(in), max)
		rest := in
		for n := 1; len(rest) > 0; n++ {
			raw := rest
			if i := bytes.IndexByte(rest, '\n'); i >= 0 {
				raw, rest = rest[:i+1], rest[i+1:]
			} else {
				rest = nil
			}
			want := bytes.TrimSpace(raw)
			if len(raw) <= max && len(want) == 0 {
				continue
			}
			got, err := r.Next()
			if len(raw) > max {
				var le *Error
				if !errors.As(err, &le) || le.Line != n || !errors.Is(err, ErrTooLong) {
					t.Fatalf("line %d (%d bytes, max %d): %q, %v", n, len(raw), max, got, err)
				}
				continue
			}
			if err != nil || !bytes.Equal(got, want) || r.Line() != n {
				t.Fatalf("line %d: got %q at %d (%v), want %q", n, got, r.Line(), err, want)
			}
		}
		if got, err := r.Next(); err != io.EOF {
			t.Fatalf("at the end: %q, %v", got, err)
		}
	})
}
