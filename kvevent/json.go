package kvevent

import (
	"errors"
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
		if fe.Field == "" {
			return &FieldError{Field: field, Err: fe.Err}
		}
		return &FieldError{Field: field + "." + fe.Field, Err: fe.Err}
	}
	return &FieldError{Field: field, Err: err}
}

// UnmarshalJSON decodes Dynamo's RouterEvent JSON. A missing storage_tier
// means device and a missing dp_rank means 0; unknown variants, unknown
// tiers, numbers that do not fit, and two variants at once are errors of
// type *FieldError naming the field. Unknown keys elsewhere are ignored.
func (e *RouterEvent) UnmarshalJSON(b []byte) error {
	d := decoder{b: b}
	var ev RouterEvent
	if err := d.routerEvent(&ev); err != nil {
		return err
	}
	if err := d.end(); err != nil {
		return err
	}
	*e = ev
	return nil
}

// UnmarshalJSON decodes Dynamo's KvCacheEvent JSON.
func (e *Event) UnmarshalJSON(b []byte) error {
	d := decoder{b: b}
	var ev Event
	if err := d.event(&ev); err != nil {
		return err
	}
	if err := d.end(); err != nil {
		return err
	}
	*e = ev
	return nil
}
