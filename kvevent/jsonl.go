package kvevent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// MaxLineBytes bounds one JSON Lines record; longer lines are an error.
const MaxLineBytes = 64 << 20

// Reader decodes a JSON Lines stream of RouterEvents, one per line. Blank
// lines are skipped. It is not safe for concurrent use.
type Reader struct {
	br   *bufio.Reader
	line int
	buf  []byte
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 64<<10)}
}

// LineError is a decoding error with the 1-based line it happened on.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// Next decodes the next event. It returns io.EOF after the last one, and a
// *LineError naming the line (and, through a wrapped *FieldError, the field)
// for malformed input.
func (r *Reader) Next() (RouterEvent, error) {
	for {
		line, err := r.readLine()
		if err != nil {
			return RouterEvent{}, err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var ev RouterEvent
		if err := ev.UnmarshalJSON(line); err != nil {
			return RouterEvent{}, &LineError{Line: r.line, Err: err}
		}
		return ev, nil
	}
}

// Line returns the number of the last line read.
func (r *Reader) Line() int { return r.line }

func (r *Reader) readLine() ([]byte, error) {
	r.buf = r.buf[:0]
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.buf = append(r.buf, chunk...)
		if len(r.buf) > MaxLineBytes {
			r.line++
			return nil, &LineError{Line: r.line, Err: fmt.Errorf("line longer than %d bytes", MaxLineBytes)}
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

// Writer encodes RouterEvents as JSON Lines. Call Flush when done. It is not
// safe for concurrent use.
type Writer struct {
	bw  *bufio.Writer
	buf []byte
}

// NewWriter returns a Writer to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{bw: bufio.NewWriterSize(w, 64<<10)}
}

// Write encodes one event and a newline.
func (w *Writer) Write(ev *RouterEvent) error {
	w.buf = append(ev.AppendJSON(w.buf[:0]), '\n')
	_, err := w.bw.Write(w.buf)
	return err
}

// Flush writes any buffered data to the underlying writer.
func (w *Writer) Flush() error { return w.bw.Flush() }
