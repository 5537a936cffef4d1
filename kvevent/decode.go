package kvevent

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// decoder is a hand-written scanner for Dynamo's RouterEvent JSON: one pass
// over the bytes, no reflection, allocating only the event's own slices.
// Keys may come in any order; unknown keys of objects other than an event's
// data are skipped (their values still validated), as serde does by
// default; the data object must hold exactly one known variant.
type decoder struct {
	b     []byte
	i     int
	depth int // objects and arrays open around the value being skipped
}

// MaxNesting bounds how deeply the values of unknown keys may nest: skipping
// them recurses, and a line of a million '[' must be an error, not a stack
// overflow that ends the process.
const MaxNesting = 64

// MaxBlocks bounds the blocks of one Stored event and the hashes of one
// Removed event (a million blocks is a prompt of 16M tokens at block size
// 16), so that one line cannot make the decoder allocate gigabytes.
const MaxBlocks = 1 << 20

// ErrTooDeep and ErrTooMany are the errors past MaxNesting and MaxBlocks.
var (
	ErrTooDeep = fmt.Errorf("values nested deeper than %d", MaxNesting)
	ErrTooMany = fmt.Errorf("more than %d blocks in one event", MaxBlocks)
)

var errEnd = errors.New("unexpected end of JSON input")

func (d *decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (d *decoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *decoder) syntax(field string, what string) error {
	if d.i >= len(d.b) {
		return &FieldError{Field: field, Err: errEnd}
	}
	return &FieldError{Field: field, Err: fmt.Errorf("invalid character %q %s at offset %d", d.b[d.i], what, d.i)}
}

func (d *decoder) expect(c byte, field, what string) error {
	if d.peek() != c {
		return d.syntax(field, what)
	}
	d.i++
	return nil
}

// literal consumes null, true or false.
func (d *decoder) literal(field string) error {
	for _, lit := range []string{"null", "true", "false"} {
		if len(d.b)-d.i >= len(lit) && string(d.b[d.i:d.i+len(lit)]) == lit {
			d.i += len(lit)
			return nil
		}
	}
	return d.syntax(field, "looking for a value")
}

// null consumes a null if one is next.
func (d *decoder) null() bool {
	if d.peek() == 'n' && len(d.b)-d.i >= 4 && string(d.b[d.i:d.i+4]) == "null" {
		d.i += 4
		return true
	}
	return false
}

// str reads a string; the result aliases the input unless it had escapes.
func (d *decoder) str(field string) ([]byte, error) {
	if err := d.expect('"', field, "looking for a string"); err != nil {
		return nil, err
	}
	start, escaped := d.i, false
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			if !escaped {
				return s, nil
			}
			var out string
			if err := json.Unmarshal(d.b[start-1:d.i], &out); err != nil {
				return nil, &FieldError{Field: field, Err: err}
			}
			return []byte(out), nil
		case c == '\\':
			escaped = true
			d.i += 2
		case c < 0x20:
			return nil, d.syntax(field, "in string literal")
		default:
			d.i++
		}
	}
	return nil, &FieldError{Field: field, Err: errEnd}
}

// number scans a JSON number and returns its text.
func (d *decoder) number(field string) ([]byte, error) {
	d.ws()
	start := d.i
	if d.i < len(d.b) && d.b[d.i] == '-' {
		d.i++
	}
	digits := func() int {
		n := 0
		for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.i < len(d.b) && d.b[d.i] == '0' {
		d.i++
	} else if digits() == 0 {
		return nil, d.syntax(field, "looking for a value")
	}
	if d.i < len(d.b) && d.b[d.i] == '.' {
		d.i++
		if digits() == 0 {
			return nil, d.syntax(field, "after decimal point in numeric literal")
		}
	}
	if d.i < len(d.b) && (d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		d.i++
		if d.i < len(d.b) && (d.b[d.i] == '+' || d.b[d.i] == '-') {
			d.i++
		}
		if digits() == 0 {
			return nil, d.syntax(field, "in exponent of numeric literal")
		}
	}
	return d.b[start:d.i], nil
}

// uint reads an unsigned integer that fits bits bits.
func (d *decoder) uint(field string, bits int) (uint64, error) {
	c := d.peek()
	if c != '-' && (c < '0' || c > '9') {
		if c == '"' || c == '{' || c == '[' || c == 't' || c == 'f' || c == 'n' {
			return 0, &FieldError{Field: field, Err: fmt.Errorf("cannot use a %s as uint%d", kindOf(c), bits)}
		}
		return 0, d.syntax(field, "looking for a value")
	}
	text, err := d.number(field)
	if err != nil {
		return 0, err
	}
	v, perr := strconv.ParseUint(string(text), 10, bits)
	if perr != nil {
		return 0, &FieldError{Field: field, Err: fmt.Errorf("cannot use number %s as uint%d", text, bits)}
	}
	return v, nil
}

func kindOf(c byte) string {
	switch c {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 'n':
		return "null"
	}
	return "bool"
}

// object calls each for every key, which must consume the value.
func (d *decoder) object(field string, each func(key []byte) error) error {
	if err := d.expect('{', field, "looking for an object"); err != nil {
		return err
	}
	if d.peek() == '}' {
		d.i++
		return nil
	}
	for {
		key, err := d.str(field)
		if err != nil {
			return err
		}
		if err := d.expect(':', field, "after object key"); err != nil {
			return err
		}
		if err := each(key); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return d.syntax(field, "after object key:value pair")
		}
	}
}

// array calls each for every element, which must consume it.
func (d *decoder) array(field string, each func(i int) error) error {
	if err := d.expect('[', field, "looking for an array"); err != nil {
		return err
	}
	if d.peek() == ']' {
		d.i++
		return nil
	}
	for i := 0; ; i++ {
		if err := each(i); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return d.syntax(field, "after array element")
		}
	}
}

// skip consumes and validates any value, nested at most MaxNesting deep.
func (d *decoder) skip(field string) error {
	switch c := d.peek(); c {
	case '{', '[':
		if d.depth == MaxNesting {
			return &FieldError{Field: field, Err: fmt.Errorf("%w at offset %d", ErrTooDeep, d.i)}
		}
		d.depth++
		defer func() { d.depth-- }()
		if c == '{' {
			return d.object(field, func([]byte) error { return d.skip(field) })
		}
		return d.array(field, func(int) error { return d.skip(field) })
	case '"':
		_, err := d.str(field)
		return err
	case 'n', 't', 'f':
		return d.literal(field)
	}
	_, err := d.number(field)
	return err
}

func (d *decoder) routerEvent(e *RouterEvent) error {
	var haveWorker, haveEvent bool
	tier := TierDevice
	err := d.object("", func(key []byte) error {
		switch string(key) {
		case "worker_id":
			if d.null() {
				return nil
			}
			v, err := d.uint("worker_id", 64)
			e.WorkerID, haveWorker = WorkerID(v), true
			return err
		case "storage_tier":
			if d.null() {
				tier = TierDevice
				return nil
			}
			s, err := d.str("storage_tier")
			if err != nil {
				return err
			}
			if tier, err = ParseTier(string(s)); err != nil {
				return &FieldError{Field: "storage_tier", Err: err}
			}
			return nil
		case "event":
			if d.null() {
				haveEvent = false
				return nil
			}
			haveEvent = true
			if err := d.event(&e.Event); err != nil {
				return fieldErr("event", err)
			}
			return nil
		}
		return d.skip(string(key))
	})
	if err != nil {
		return err
	}
	switch {
	case !haveWorker:
		return &FieldError{Field: "worker_id", Err: ErrMissing}
	case !haveEvent:
		return &FieldError{Field: "event", Err: ErrMissing}
	}
	e.Tier = tier
	return nil
}

func (d *decoder) event(e *Event) error {
	var haveID bool
	*e = Event{}
	err := d.object("", func(key []byte) error {
		switch string(key) {
		case "event_id":
			if d.null() {
				haveID = false
				return nil
			}
			v, err := d.uint("event_id", 64)
			e.ID, haveID = v, true
			return err
		case "dp_rank":
			if d.null() {
				e.DPRank = 0
				return nil
			}
			v, err := d.uint("dp_rank", 32)
			if err == nil && v > uint64(MaxDPRank) {
				err = &FieldError{Field: "dp_rank", Err: fmt.Errorf("%d past the highest, %d", v, MaxDPRank)}
			}
			e.DPRank = DPRank(v)
			return err
		case "data":
			data, err := d.data()
			if err != nil {
				return fieldErr("data", err)
			}
			e.Data = data
			return nil
		}
		return d.skip(string(key))
	})
	switch {
	case err != nil:
		return err
	case !haveID:
		return &FieldError{Field: "event_id", Err: ErrMissing}
	case e.Data == nil:
		return &FieldError{Field: "data", Err: ErrMissing}
	}
	return nil
}

func (d *decoder) data() (Data, error) {
	switch d.peek() {
	case '"':
		s, err := d.str("")
		if err != nil {
			return nil, err
		}
		if string(s) == "cleared" {
			return Cleared{}, nil
		}
		return nil, fmt.Errorf("unknown variant %q", s)
	case '{':
	case 0:
		return nil, errEnd
	default:
		return nil, fmt.Errorf("want \"cleared\" or an object with one variant, got %s", kindOf(d.b[d.i]))
	}
	var out Data
	variants := 0
	err := d.object("", func(key []byte) error {
		var err error
		switch string(key) {
		case "stored":
			out, err = d.stored()
		case "removed":
			out, err = d.removed()
		default:
			return fmt.Errorf("unknown variant %q", key)
		}
		variants++
		return err
	})
	switch {
	case err != nil:
		return nil, err
	case variants > 1:
		return nil, errors.New("two variants at once (stored and removed)")
	case out == nil:
		return nil, errors.New("no variant")
	}
	return out, nil
}

func (d *decoder) stored() (Data, error) {
	var s Stored
	haveBlocks := false
	err := d.object("stored", func(key []byte) error {
		switch string(key) {
		case "parent_hash":
			if d.null() {
				s.HasParent, s.ParentHash = false, 0
				return nil
			}
			v, err := d.uint("stored.parent_hash", 64)
			s.HasParent, s.ParentHash = true, v
			return err
		case "blocks":
			if d.null() {
				haveBlocks = false
				return nil
			}
			haveBlocks = true
			s.Blocks = s.Blocks[:0]
			return d.array("stored.blocks", func(i int) error {
				if i == MaxBlocks {
					return &FieldError{Field: "stored.blocks", Err: ErrTooMany}
				}
				blk, err := d.block()
				s.Blocks = append(s.Blocks, blk)
				return indexed(err, i)
			})
		}
		return d.skip("stored." + string(key))
	})
	if err != nil {
		return nil, err
	}
	if !haveBlocks {
		return nil, &FieldError{Field: "stored.blocks", Err: ErrMissing}
	}
	if len(s.Blocks) == 0 {
		s.Blocks = nil
	}
	return s, nil
}

// indexMark stands for an array index in field names until indexed fills
// it in, so that names are built only when there is an error.
const indexMark = "[#]"

// indexed writes index i into an error's field name.
func indexed(err error, i int) error {
	var fe *FieldError
	if err == nil || !errors.As(err, &fe) {
		return err
	}
	return &FieldError{Field: strings.Replace(fe.Field, indexMark, "["+strconv.Itoa(i)+"]", 1), Err: fe.Err}
}

func (d *decoder) block() (StoredBlock, error) {
	var b StoredBlock
	var haveBlock, haveTokens bool
	err := d.object("stored.blocks"+indexMark, func(key []byte) error {
		var err error
		switch string(key) {
		case "block_hash":
			b.BlockHash, err = d.uint("stored.blocks"+indexMark+".block_hash", 64)
			haveBlock = true
		case "tokens_hash":
			b.TokensHash, err = d.uint("stored.blocks"+indexMark+".tokens_hash", 64)
			haveTokens = true
		default:
			err = d.skip("stored.blocks" + indexMark + "." + string(key))
		}
		return err
	})
	switch {
	case err != nil:
		return b, err
	case !haveBlock:
		return b, &FieldError{Field: "stored.blocks" + indexMark + ".block_hash", Err: ErrMissing}
	case !haveTokens:
		return b, &FieldError{Field: "stored.blocks" + indexMark + ".tokens_hash", Err: ErrMissing}
	}
	return b, nil
}

func (d *decoder) removed() (Data, error) {
	var r Removed
	have := false
	err := d.object("removed", func(key []byte) error {
		if string(key) != "block_hashes" {
			return d.skip("removed." + string(key))
		}
		if d.null() {
			have = false
			return nil
		}
		have = true
		r.BlockHashes = r.BlockHashes[:0]
		return d.array("removed.block_hashes", func(i int) error {
			if i == MaxBlocks {
				return &FieldError{Field: "removed.block_hashes", Err: ErrTooMany}
			}
			v, err := d.uint("removed.block_hashes"+indexMark, 64)
			r.BlockHashes = append(r.BlockHashes, v)
			return indexed(err, i)
		})
	})
	if err != nil {
		return nil, err
	}
	if !have {
		return nil, &FieldError{Field: "removed.block_hashes", Err: ErrMissing}
	}
	if len(r.BlockHashes) == 0 {
		r.BlockHashes = nil
	}
	return r, nil
}

// end checks nothing but space follows the value.
func (d *decoder) end() error {
	if d.peek() != 0 {
		return d.syntax("", "after top-level value")
	}
	return nil
}
