package kvevent

import (
	"bufio"
	"io"

	"github.com/kvradix/kvradix/internal/lines"
)

// MaxLineBytes bounds one JSON Lines record; a longer line is skipped to
// its end and reported as a *LineError.
const MaxLineBytes = lines.MaxBytes

// Reader decodes a JSON Lines stream of RouterEvents, one per line. Blank
// lines are skipped. It is not safe for concurrent use.
type Reader struct {
	lr *lines.Reader
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	return &Reader{lr: lines.NewReader(r, MaxLineBytes)}
}

// LineError is an error in one line, with its 1-based number (the field is
// named by a wrapped *FieldError). It is the one line error of kvradix's
// readers: trace.LineError is the same type.
type LineError = lines.Error

// Next decodes the next event. It returns io.EOF after the last one, and a
// *LineError naming the line (and, through a wrapped *FieldError, the field)
// for malformed input.
func (r *Reader) Next() (RouterEvent, error) {
	line, err := r.lr.Next()
	if err != nil {
		return RouterEvent{}, err
	}
	var ev RouterEvent
	if err := ev.UnmarshalJSON(line); err != nil {
		return RouterEvent{}, &LineError{Line: r.lr.Line(), Err: err}
	}
	return ev, nil
}

// Line returns the number of the last line read.
func (r *Reader) Line() int { return r.lr.Line() }

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
