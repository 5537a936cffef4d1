// Package trace reads and generates LLM serving workloads in the Mooncake
// trace format: one request per JSON line with its arrival time, prompt and
// output lengths, and one hash id per 512-token prompt block, where equal
// ids at the same position mean an equal prefix. It also turns a request
// into token ids for any KV block size, preserving that prefix sharing.
//
// The Mooncake FAST'25 conversation trace is embedded as the default
// workload (see data/README.md for its source and license).
package trace

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kvradix/kvradix/internal/lines"
)

// TraceBlockSize is the number of tokens a trace hash id stands for.
const TraceBlockSize = 512

// Request is one trace request.
type Request struct {
	Timestamp    float64  // arrival, ms from the trace start
	InputLength  int      // prompt tokens
	OutputLength int      // generated tokens
	HashIDs      []uint64 // one per 512-token prompt block, the last maybe partial
}

//go:embed data/conversation_trace.jsonl
var conversation []byte

// DefaultName names the embedded trace in reports.
const DefaultName = "mooncake-conversation (embedded)"

// Default returns a reader over the embedded Mooncake conversation trace.
func Default() io.Reader { return bytes.NewReader(conversation) }

// Reader streams requests from a JSON Lines trace; it holds one line at a
// time, so a trace of any size streams. It is not safe for concurrent use.
type Reader struct {
	lr   *lines.Reader
	line int
}

// MaxLineBytes bounds one trace line; a longer line is skipped to its end
// and reported as a *LineError.
const MaxLineBytes = lines.MaxBytes

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader { return &Reader{lr: lines.NewReader(r, MaxLineBytes)} }

// LineError is an error in one line of a trace, naming the line and, when
// known, the field; it is kvevent.LineError too.
type LineError = lines.Error

type wireRequest struct {
	Timestamp    *float64  `json:"timestamp"`
	InputLength  *int      `json:"input_length"`
	OutputLength *int      `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

var errMissing = errors.New("missing")

// Next returns the next request, io.EOF after the last, or a *LineError
// naming the line and field of a malformed one. Blank lines are skipped.
func (r *Reader) Next() (Request, error) {
	line, err := r.lr.Next()
	if err != nil {
		return Request{}, err
	}
	r.line = r.lr.Line()
	return r.parse(line)
}

func (r *Reader) parse(line []byte) (Request, error) {
	var w wireRequest
	if err := json.Unmarshal(line, &w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Request{}, &LineError{Line: r.line, Field: te.Field, Err: fmt.Errorf("cannot use %s as %v", te.Value, te.Type)}
		}
		return Request{}, &LineError{Line: r.line, Err: err}
	}
	bad := func(field string, err error) (Request, error) {
		return Request{}, &LineError{Line: r.line, Field: field, Err: err}
	}
	switch {
	case w.Timestamp == nil:
		return bad("timestamp", errMissing)
	case *w.Timestamp < 0:
		return bad("timestamp", fmt.Errorf("negative (%v)", *w.Timestamp))
	case w.InputLength == nil:
		return bad("input_length", errMissing)
	case *w.InputLength <= 0:
		return bad("input_length", fmt.Errorf("%d, want > 0", *w.InputLength))
	case w.OutputLength == nil:
		return bad("output_length", errMissing)
	case *w.OutputLength < 0:
		return bad("output_length", fmt.Errorf("%d, want >= 0", *w.OutputLength))
	case w.HashIDs == nil:
		return bad("hash_ids", errMissing)
	}
	if want := ceilDiv(*w.InputLength, TraceBlockSize); len(*w.HashIDs) != want {
		return bad("hash_ids", fmt.Errorf("%d ids for %d input tokens, want ceil(%d/%d) = %d",
			len(*w.HashIDs), *w.InputLength, *w.InputLength, TraceBlockSize, want))
	}
	return Request{Timestamp: *w.Timestamp, InputLength: *w.InputLength, OutputLength: *w.OutputLength, HashIDs: *w.HashIDs}, nil
}

// ceilDiv is ⌈a/b⌉ for a > 0, without overflowing near the top of int.
func ceilDiv(a, b int) int {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// ErrEmpty is the error of a trace with no request.
var ErrEmpty = errors.New("trace has no request")

// ReadAll reads every request of r; a trace without any is ErrEmpty.
func ReadAll(r io.Reader) ([]Request, error) {
	tr := NewReader(r)
	var out []Request
	for {
		req, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if len(out) == 0 {
				return nil, ErrEmpty
			}
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, req)
	}
}

// Vocab bounds the token ids Tokens produces.
const Vocab = 1 << 17

// Tokens appends the prompt's token ids to dst: the 512 tokens of hash id
// h are a fixed pseudo-random function of h, so requests with equal ids
// share equal tokens (and hash to equal blocks at any block size), and
// different ids give different tokens. The last block is cut to the
// prompt's length.
func Tokens(dst []uint32, req Request) []uint32 { return TokensOf(dst, req, TraceBlockSize) }

// TokensOf is Tokens with tbs tokens per hash id (req as Stretch returns
// it for tbs).
func TokensOf(dst []uint32, req Request, tbs int) []uint32 {
	for i, h := range req.HashIDs {
		n := min(tbs, req.InputLength-i*tbs)
		x := h*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
		for range n {
			// splitmix64
			x += 0x9E3779B97F4A7C15
			z := x
			z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
			z = (z ^ z>>27) * 0x94D049BB133111EB
			z ^= z >> 31
			dst = append(dst, uint32(z%Vocab))
		}
	}
	return dst
}

// Stretch returns req made k times longer, for tbs tokens per hash id
// (TokensOf): each hash id h becomes the k ids h·k, ..., h·k+k-1 (so
// requests sharing a prefix of ids still share a prefix, k times longer),
// and the prompt is InputLength·k·tbs/512 tokens, its ids cut to those it
// uses. k = 1 and tbs = 512 return req unchanged.
func Stretch(req Request, k, tbs int) Request {
	if k == 1 && tbs == TraceBlockSize {
		return req
	}
	out := req
	out.InputLength = ceilDiv(req.InputLength*k*tbs, TraceBlockSize)
	n := ceilDiv(out.InputLength, tbs)
	out.HashIDs = make([]uint64, 0, n)
	for _, h := range req.HashIDs {
		for j := range k {
			if len(out.HashIDs) < n {
				out.HashIDs = append(out.HashIDs, h*uint64(k)+uint64(j))
			}
		}
	}
	return out
}
