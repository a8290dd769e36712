// Package wire holds what the binary codecs of ownership and its gossip
// share: a decoder of canonical encodings, the flags of a token's encoding,
// and the error every decoding failure wraps. It is plumbing, not API.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformed is ownership.ErrMalformedToken: bytes or text that do not
// decode to a token, a claim or a gossip register; or a token that can't be
// encoded.
var ErrMalformed = errors.New("tenure: malformed token")

// The flags byte of a token's binary encoding, and of a claim's (the same
// layout).
const (
	FlagMAC      = 1 << 0 // a MAC follows
	FlagReleased = 1 << 1 // a claim's release
)

// Flags returns the flags byte of an encoding: FlagMAC if signed,
// FlagReleased if released.
func Flags(signed, released bool) byte {
	var f byte
	if signed {
		f |= FlagMAC
	}
	if released {
		f |= FlagReleased
	}
	return f
}

// Malformed returns an error wrapping ErrMalformed with a formatted detail.
func Malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Decoder reads the fields of a canonical encoding. The first fault sticks;
// later reads return zero values. (The fault is a plain value so that the
// bytes decoded never escape through the error.)
type Decoder struct {
	B     []byte
	fault Fault
}

// A Fault is why a decoding failed.
type Fault uint8

// The faults.
const (
	FaultNone Fault = iota
	FaultTruncated
	FaultOverflow
	FaultNonMinimal
	FaultTrailing
	FaultInvalid
)

// String names the fault.
func (f Fault) String() string {
	switch f {
	case FaultTruncated:
		return "truncated"
	case FaultOverflow:
		return "uvarint overflows 64 bits"
	case FaultNonMinimal:
		return "non-minimal uvarint"
	case FaultTrailing:
		return "trailing bytes"
	case FaultInvalid:
		return "invalid stable membership"
	}
	return "ok"
}

// Fail records f unless a fault is recorded already.
func (d *Decoder) Fail(f Fault) {
	if d.fault == FaultNone {
		d.fault = f
	}
}

// OK reports whether every read so far succeeded.
func (d *Decoder) OK() bool { return d.fault == FaultNone }

// Err returns the first fault as an error, or nil.
func (d *Decoder) Err() error {
	if d.fault == FaultNone {
		return nil
	}
	return Malformed("%v", d.fault)
}

// Byte reads a byte.
func (d *Decoder) Byte() byte {
	if !d.OK() {
		return 0
	}
	if len(d.B) == 0 {
		d.Fail(FaultTruncated)
		return 0
	}
	v := d.B[0]
	d.B = d.B[1:]
	return v
}

// Bytes reads n bytes (not copied).
func (d *Decoder) Bytes(n int) []byte {
	if !d.OK() {
		return nil
	}
	if len(d.B) < n {
		d.Fail(FaultTruncated)
		return nil
	}
	v := d.B[:n:n]
	d.B = d.B[n:]
	return v
}

// Uvarint reads a minimal uvarint.
func (d *Decoder) Uvarint() uint64 {
	if !d.OK() {
		return 0
	}
	v, n := binary.Uvarint(d.B)
	switch {
	case n == 0:
		d.Fail(FaultTruncated)
		return 0
	case n < 0:
		d.Fail(FaultOverflow)
		return 0
	case n > 1 && d.B[n-1] == 0:
		d.Fail(FaultNonMinimal)
		return 0
	}
	d.B = d.B[n:]
	return v
}

// End reports the first fault, or trailing bytes.
func (d *Decoder) End() error {
	if d.OK() && len(d.B) != 0 {
		d.Fail(FaultTrailing)
	}
	return d.Err()
}
