package kvevent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// AppendJSON appends the JSON form of e, exactly as Dynamo serialises a
// RouterEvent, and returns the extended buffer:
//
//	{"worker_id":7,"storage_tier":"device","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":11,"tokens_hash":22}]}},"dp_rank":0}}
//
// A nil Data encodes as null, which decoding rejects.
func (e *RouterEvent) AppendJSON(b []byte) []byte {
	b = append(b, `{"worker_id":`...)
	b = strconv.AppendUint(b, uint64(e.WorkerID), 10)
	b = append(b, `,"storage_tier":"`...)
	b = append(b, e.Tier.String()...)
	b = append(b, `","event":`...)
	return append(e.Event.AppendJSON(b), '}')
}

// AppendJSON appends the JSON form of the event (Dynamo's KvCacheEvent).
func (e *Event) AppendJSON(b []byte) []byte {
	b = append(b, `{"event_id":`...)
	b = strconv.AppendUint(b, e.ID, 10)
	b = append(b, `,"data":`...)
	switch d := e.Data.(type) {
	case Stored:
		b = append(b, `{"stored":{"parent_hash":`...)
		if d.HasParent {
			b = strconv.AppendUint(b, d.ParentHash, 10)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"blocks":[`...)
		for i, blk := range d.Blocks {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"block_hash":`...)
			b = strconv.AppendUint(b, blk.BlockHash, 10)
			b = append(b, `,"tokens_hash":`...)
			b = strconv.AppendUint(b, blk.TokensHash, 10)
			b = append(b, '}')
		}
		b = append(b, "]}}"...)
	case Removed:
		b = append(b, `{"removed":{"block_hashes":[`...)
		for i, h := range d.BlockHashes {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, h, 10)
		}
		b = append(b, "]}}"...)
	case Cleared:
		b = append(b, `"cleared"`...)
	default:
		b = append(b, "null"...)
	}
	b = append(b, `,"dp_rank":`...)
	b = strconv.AppendUint(b, uint64(e.DPRank), 10)
	return append(b, '}')
}

// MarshalJSON implements json.Marshaler with AppendJSON.
func (e RouterEvent) MarshalJSON() ([]byte, error) { return e.AppendJSON(nil), nil }

// MarshalJSON implements json.Marshaler with AppendJSON.
func (e Event) MarshalJSON() ([]byte, error) { return e.AppendJSON(nil), nil }

// The wire shapes decoding goes through; pointers mark required fields.
type (
	wireRouterEvent struct {
		WorkerID    *uint64    `json:"worker_id"`
		StorageTier *string    `json:"storage_tier"`
		Event       *wireEvent `json:"event"`
	}
	wireEvent struct {
		EventID *uint64         `json:"event_id"`
		Data    json.RawMessage `json:"data"`
		DPRank  uint32          `json:"dp_rank"`
	}
	wireData struct {
		Stored  *wireStored  `json:"stored"`
		Removed *wireRemoved `json:"removed"`
	}
	wireStored struct {
		ParentHash *uint64      `json:"parent_hash"`
		Blocks     *[]wireBlock `json:"blocks"`
	}
	wireBlock struct {
		BlockHash  *uint64 `json:"block_hash"`
		TokensHash *uint64 `json:"tokens_hash"`
	}
	wireRemoved struct {
		BlockHashes *[]uint64 `json:"block_hashes"`
	}
)

// FieldError is a decoding error that names the JSON field at fault, as a
// dotted path such as "event.data.stored.blocks[2].block_hash".
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// ErrMissing is wrapped by errors for required fields that are absent.
var ErrMissing = errors.New("missing field")

func fieldErr(field string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: field + "." + fe.Field, Err: fe.Err}
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return &FieldError{Field: field + "." + te.Field, Err: fmt.Errorf("cannot use %s as %v", te.Value, te.Type)}
	}
	return &FieldError{Field: field, Err: err}
}

// UnmarshalJSON decodes Dynamo's RouterEvent JSON. A missing storage_tier
// means device and a missing dp_rank means 0; unknown variants, unknown
// tiers, numbers that do not fit, and two variants at once are errors of
// type *FieldError naming the field.
func (e *RouterEvent) UnmarshalJSON(b []byte) error {
	var w wireRouterEvent
	if err := json.Unmarshal(b, &w); err != nil {
		return typeErr(err)
	}
	if w.WorkerID == nil {
		return &FieldError{Field: "worker_id", Err: ErrMissing}
	}
	tier := TierDevice
	if w.StorageTier != nil {
		t, err := ParseTier(*w.StorageTier)
		if err != nil {
			return &FieldError{Field: "storage_tier", Err: err}
		}
		tier = t
	}
	if w.Event == nil {
		return &FieldError{Field: "event", Err: ErrMissing}
	}
	ev, err := w.Event.decode()
	if err != nil {
		return fieldErr("event", err)
	}
	*e = RouterEvent{WorkerID: WorkerID(*w.WorkerID), Tier: tier, Event: ev}
	return nil
}

// UnmarshalJSON decodes Dynamo's KvCacheEvent JSON.
func (e *Event) UnmarshalJSON(b []byte) error {
	var w wireEvent
	if err := json.Unmarshal(b, &w); err != nil {
		return typeErr(err)
	}
	ev, err := w.decode()
	if err != nil {
		return err
	}
	*e = ev
	return nil
}

// typeErr turns encoding/json's type errors into FieldErrors.
func typeErr(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return &FieldError{Field: te.Field, Err: fmt.Errorf("cannot use %s as %v", te.Value, te.Type)}
	}
	return err
}

func (w *wireEvent) decode() (Event, error) {
	if w.EventID == nil {
		return Event{}, &FieldError{Field: "event_id", Err: ErrMissing}
	}
	if len(w.Data) == 0 {
		return Event{}, &FieldError{Field: "data", Err: ErrMissing}
	}
	d, err := decodeData(w.Data)
	if err != nil {
		return Event{}, fieldErr("data", err)
	}
	return Event{ID: *w.EventID, DPRank: DPRank(w.DPRank), Data: d}, nil
}

var clearedJSON = []byte(`"cleared"`)

func decodeData(raw json.RawMessage) (Data, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		if bytes.Equal(raw, clearedJSON) {
			return Cleared{}, nil
		}
		return nil, fmt.Errorf("unknown variant %s", raw)
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, fmt.Errorf("want \"cleared\" or an object with one variant, got %.20s", raw)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var wd wireData
	if err := dec.Decode(&wd); err != nil {
		if te := typeErr(err); te != err {
			return nil, te
		}
		return nil, fmt.Errorf("unknown variant or bad variant body: %w", err)
	}
	switch {
	case wd.Stored != nil && wd.Removed != nil:
		return nil, errors.New("two variants at once (stored and removed)")
	case wd.Stored != nil:
		s := wd.Stored
		if s.Blocks == nil {
			return nil, &FieldError{Field: "stored.blocks", Err: ErrMissing}
		}
		out := Stored{}
		if s.ParentHash != nil {
			out.HasParent, out.ParentHash = true, *s.ParentHash
		}
		if len(*s.Blocks) > 0 {
			out.Blocks = make([]StoredBlock, len(*s.Blocks))
		}
		for i, blk := range *s.Blocks {
			if blk.BlockHash == nil {
				return nil, &FieldError{Field: fmt.Sprintf("stored.blocks[%d].block_hash", i), Err: ErrMissing}
			}
			if blk.TokensHash == nil {
				return nil, &FieldError{Field: fmt.Sprintf("stored.blocks[%d].tokens_hash", i), Err: ErrMissing}
			}
			out.Blocks[i] = StoredBlock{BlockHash: *blk.BlockHash, TokensHash: *blk.TokensHash}
		}
		return out, nil
	case wd.Removed != nil:
		if wd.Removed.BlockHashes == nil {
			return nil, &FieldError{Field: "removed.block_hashes", Err: ErrMissing}
		}
		hs := *wd.Removed.BlockHashes
		if len(hs) == 0 {
			hs = nil
		}
		return Removed{BlockHashes: hs}, nil
	}
	return nil, errors.New("no variant")
}
