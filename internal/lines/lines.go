// Package lines reads JSON Lines input one non-blank line at a time,
// holding one line in memory whatever the input's size. It is shared by the
// event and trace readers.
package lines

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

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
// io.EOF after the last.
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
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.buf = append(r.buf, chunk...)
		if len(r.buf) > r.max {
			r.line++
			return nil, fmt.Errorf("line %d: longer than %d bytes", r.line, r.max)
		}
		switch {
		case err == nil:
			r.line++
			return r.buf, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(r.buf) == 0 {
				return nil, io.EOF
			}
			r.line++
			return r.buf, nil
		default:
			return nil, err
		}
	}
}
