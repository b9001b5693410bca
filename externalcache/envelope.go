package externalcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// An envelope is what the cache stores per key in bigcache: the value with the metadata that
// decides how it may be served. It is plain bytes, so entries hold no Go pointers and the garbage
// collector never scans them; bigcache's own timestamps are only used to drop entries that are
// certainly dead (past the hard TTL).
//
// Layout (little endian):
//
//	0      version (1)
//	1      flags (bit 0: negative, the key did not exist)
//	2..9   revision
//	10..17 fetchedAt, Unix nanoseconds
//	18..25 softExpiry, Unix nanoseconds
//	26..33 hardExpiry, Unix nanoseconds
//	34..   value
type envelope struct {
	revision   int64
	fetchedAt  int64
	softExpiry int64
	hardExpiry int64
	negative   bool
	value      []byte
}

const (
	envelopeVersion    = 1
	envelopeHeaderSize = 34
	flagNegative       = 1 << 0
)

var errBadEnvelope = errors.New("malformed cache envelope")

// appendEnvelope appends the encoded envelope to dst.
func appendEnvelope(dst []byte, e envelope) []byte {
	var flags byte
	if e.negative {
		flags |= flagNegative
	}
	dst = append(dst, envelopeVersion, flags)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.revision))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.fetchedAt))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.softExpiry))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.hardExpiry))
	return append(dst, e.value...)
}

// decodeEnvelope decodes b; the value aliases b.
func decodeEnvelope(b []byte) (envelope, error) {
	if len(b) < envelopeHeaderSize {
		return envelope{}, fmt.Errorf("%w: %d bytes, the header alone is %d", errBadEnvelope, len(b), envelopeHeaderSize)
	}
	if b[0] != envelopeVersion {
		return envelope{}, fmt.Errorf("%w: version %d", errBadEnvelope, b[0])
	}
	if b[1]&^flagNegative != 0 {
		return envelope{}, fmt.Errorf("%w: unknown flags %#x", errBadEnvelope, b[1])
	}
	return envelope{
		negative:   b[1]&flagNegative != 0,
		revision:   int64(binary.LittleEndian.Uint64(b[2:])),
		fetchedAt:  int64(binary.LittleEndian.Uint64(b[10:])),
		softExpiry: int64(binary.LittleEndian.Uint64(b[18:])),
		hardExpiry: int64(binary.LittleEndian.Uint64(b[26:])),
		value:      b[envelopeHeaderSize:],
	}, nil
}

// lookup says how the envelope may be served at now. ok is false when it may not be served at all
// (past its hard expiry): the key must then be fetched as if it were missing.
func (e envelope) lookup(now time.Time) (l Lookup, ok bool) {
	n := now.UnixNano()
	if n >= e.hardExpiry {
		return Lookup{}, false
	}
	l = Lookup{Revision: e.revision, FetchedAt: time.Unix(0, e.fetchedAt)}
	switch {
	case e.negative:
		l.State = StateNotFound
	case n < e.softExpiry:
		l.State, l.Value = StateFresh, e.value
	default:
		l.State, l.Value = StateStale, e.value
	}
	return l, true
}
