// Package lines reads JSON Lines input one non-blank line at a time,
// holding one line in memory whatever the input's size. It is shared by the
// event and trace readers, with their one error type and line bound.
package lines

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// MaxBytes bounds one line of the event and trace readers.
const MaxBytes = 64 << 20

// ErrTooLong is the error of a line longer than the reader's bound.
var ErrTooLong = errors.New("line too long")

// Error is an error in one line of input: its 1-based number, the field at
// fault if known, and the cause.
type Error struct {
	Line  int
	Field string // empty when the line as a whole is at fault
	Err   error
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("line %d: %s: %v", e.Line, e.Field, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Reader returns the non-blank lines of its input, trimmed. It is not safe
// for concurrent use.
type Reader struct {
	br   *bufio.Reader
	max  int
	line int
	buf  []byte
}

// NewReader returns a Reader over r that refuses lines longer than max
// bytes.
func NewReader(r io.Reader, max int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 64<<10), max: max}
}

// Line returns the 1-based number of the last line read.
func (r *Reader) Line() int { return r.line }

// Next returns the next non-blank line, valid until the following call, or
// io.EOF after the last. A line longer than the bound is skipped to its end
// and reported as an *Error wrapping ErrTooLong; the next call goes on with
// the line after it.
func (r *Reader) Next() ([]byte, error) {
	for {
		line, err := r.read()
		if err != nil {
			return nil, err
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			return line, nil
		}
	}
}

func (r *Reader) read() ([]byte, error) {
	r.buf = r.buf[:0]
	tooLong := false
	for {
		chunk, err := r.br.ReadSlice('\n')
		if !tooLong {
			r.buf = append(r.buf, chunk...)
			tooLong = len(r.buf) > r.max
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil && !errors.Is(err, io.EOF):
			return nil, err
		case errors.Is(err, io.EOF) && len(r.buf) == 0:
			return nil, io.EOF
		}
		r.line++
		if tooLong {
			r.buf = r.buf[:0]
			return nil, &Error{Line: r.line, Err: fmt.Errorf("%w: more than %d bytes", ErrTooLong, r.max)}
		}
		return r.buf, nil
	}
}
