package configcenter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Value is a key's current content as the config center answers it. Revision is the global
// revision of the key's last change, so a reader can tell which of two values is newer.
type Value struct {
	Value    string `json:"value"`
	Revision int64  `json:"revision"`
}

// ChangeSet answers a change-feed poll: the keys of one domain that changed after the revision
// the caller already has, and the revision to ask from next time.
type ChangeSet struct {
	// Revision is where the next poll should start. When the answer was truncated it is the
	// revision of the last change included, so the next poll returns the rest at once.
	// A Revision lower than the one asked for means the server lost its history (a restart).
	Revision int64    `json:"revision"`
	Changes  []Change `json:"changes"`
	// Epoch identifies the server's history: it changes when the server restarts and revisions
	// start over, so a poller knows to resynchronise even when the new revisions look plausible.
	Epoch string `json:"epoch"`
}

// Change names a key that changed and the revision of its latest change. Only the latest change
// per key is kept, like a compacted log: a reader refetches the key, it does not replay history.
type Change struct {
	Key      string `json:"key"`
	Revision int64  `json:"revision"`
	Deleted  bool   `json:"deleted"`
}

// Duration is a time.Duration written as a Go duration string ("150ms") in JSON, so that fault
// settings are readable and writable by people with curl.
type Duration struct {
	time.Duration
}

// MarshalJSON writes the duration as a string such as "1.5s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}

// UnmarshalJSON reads a Go duration string such as "250ms".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"250ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// ErrorBody is the JSON body of every 4xx and 5xx answer.
type ErrorBody struct {
	Error string `json:"error"`
	// Reason is ReasonNotFound on the server's own answer that a domain or
	// key does not exist: a 404 without it (a misrouted proxy's page) is
	// not one, and must not be cached as "this key does not exist".
	Reason string `json:"reason,omitempty"`
}

// ReasonNotFound marks the config center's authoritative not-found answer.
const ReasonNotFound = "NotFound"

// PutBody is the JSON body of a PUT to a key.
type PutBody struct {
	Value *string `json:"value"`
}

// valueBody is Value with presence detection, so that a body without "revision" is refused
// instead of read as revision 0.
type valueBody struct {
	Value    *string `json:"value"`
	Revision *int64  `json:"revision"`
}

type changeSetBody struct {
	Revision *int64   `json:"revision"`
	Changes  []Change `json:"changes"`
	Epoch    string   `json:"epoch"`
}

// ErrBodyTooLarge is returned when a body is longer than the reader allows.
var ErrBodyTooLarge = errors.New("body too large")

// readBounded reads at most limit bytes from r and fails, without reading further, when there are
// more. It is what keeps a broken or hostile peer from making either side buffer without bound.
func readBounded(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, limit)
	}
	return data, nil
}

// DecodeStrict decodes exactly one JSON value into v: unknown fields, trailing data and bodies
// longer than limit are errors, because a peer that sends them is not the peer this code expects.
func DecodeStrict(r io.Reader, limit int64, v any) error {
	data, err := readBounded(r, limit)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("decoding JSON: unexpected data after the object")
	}
	return nil
}

// decodeValue reads a key's value as the server answers it.
func decodeValue(r io.Reader, limit int64) (Value, error) {
	var b valueBody
	if err := DecodeStrict(r, limit, &b); err != nil {
		return Value{}, err
	}
	if b.Value == nil || b.Revision == nil {
		return Value{}, errors.New("decoding value: \"value\" and \"revision\" are required")
	}
	if *b.Revision < 1 {
		return Value{}, fmt.Errorf("decoding value: revision %d is not positive", *b.Revision)
	}
	return Value{Value: *b.Value, Revision: *b.Revision}, nil
}

// decodeChangeSet reads a change-feed answer and checks that it is consistent, so that a
// corrupt answer cannot make a cache invalidate nonsense keys.
func decodeChangeSet(r io.Reader, limit int64) (ChangeSet, error) {
	var b changeSetBody
	if err := DecodeStrict(r, limit, &b); err != nil {
		return ChangeSet{}, err
	}
	if b.Revision == nil || *b.Revision < 0 {
		return ChangeSet{}, errors.New("decoding change set: a non-negative \"revision\" is required")
	}
	if len(b.Epoch) > 64 {
		return ChangeSet{}, fmt.Errorf("decoding change set: epoch is %d bytes long, at most 64 are allowed", len(b.Epoch))
	}
	cs := ChangeSet{Revision: *b.Revision, Changes: b.Changes, Epoch: b.Epoch}
	for _, c := range cs.Changes {
		if err := ValidateKey(c.Key); err != nil {
			return ChangeSet{}, fmt.Errorf("decoding change set: %w", err)
		}
		if c.Revision < 1 || c.Revision > cs.Revision {
			return ChangeSet{}, fmt.Errorf("decoding change set: change of %q has revision %d outside 1..%d", c.Key, c.Revision, cs.Revision)
		}
	}
	return cs, nil
}
