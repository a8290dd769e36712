package ownership

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// Token encodings.
//
// Binary, version 1 (the same layout carries a Claim, see claimFlagReleased):
//
//	version      1 byte, always 1
//	flags        1 byte: bit 0 set when a MAC follows; other bits zero
//	partition    uvarint, at most 2^32-1
//	epoch        uvarint
//	incarnation  uvarint
//	owner        1 byte length (0 to MaxOwnerSize), then the name's bytes
//	MAC          MACSize bytes, present only when flag bit 0 is set
//
// Every token has exactly one encoding: uvarints are minimal, no unknown flag
// is set, the MAC flag appears exactly when the MAC is non-zero, and nothing
// follows the last field. Decoders reject everything else, so decoding then
// encoding gives back the input bytes.
//
// Text, version 1: "v1." followed by the binary encoding in unpadded
// base64url (RFC 4648 section 5). Every character is legal in an HTTP header
// value and in gRPC ASCII metadata.
const (
	// MaxOwnerSize is the longest owner name a token can carry, in bytes.
	MaxOwnerSize = 255
	// MaxTokenSize is the largest binary encoding of a token or claim, in
	// bytes.
	MaxTokenSize = 2 + binary.MaxVarintLen32 + 2*binary.MaxVarintLen64 + 1 + MaxOwnerSize + MACSize
	// MaxTokenTextSize is the longest text encoding of a token, in bytes.
	MaxTokenTextSize = len(tokenTextPrefix) + (MaxTokenSize*8+5)/6
)

const (
	tokenVersion    = 1
	tokenTextPrefix = "v1."

	tokenFlagMAC      = 1 << 0
	claimFlagReleased = 1 << 1
)

var tokenText = base64.RawURLEncoding.Strict()

// AppendBinary appends the binary encoding of t to b. It fails, wrapping
// ErrMalformedToken, only when the owner is longer than MaxOwnerSize.
func (t Token) AppendBinary(b []byte) ([]byte, error) {
	return appendToken(b, t, false)
}

// MarshalBinary returns the binary encoding of t.
func (t Token) MarshalBinary() ([]byte, error) {
	return t.AppendBinary(make([]byte, 0, encodedSize(t)))
}

// UnmarshalBinary sets *t to the token encoded in b. On error *t is
// unchanged.
func (t *Token) UnmarshalBinary(b []byte) error {
	u, err := ParseToken(b)
	if err != nil {
		return err
	}
	*t = u
	return nil
}

// ParseToken decodes a token's binary encoding. Any input that is not the
// canonical encoding of a token yields an error wrapping ErrMalformedToken.
func ParseToken(b []byte) (Token, error) {
	t, _, err := decodeToken(b, 0)
	return t, err
}

// AppendText appends the text encoding of t to b.
func (t Token) AppendText(b []byte) ([]byte, error) {
	var buf [MaxTokenSize]byte
	raw, err := t.AppendBinary(buf[:0])
	if err != nil {
		return b, err
	}
	b = append(b, tokenTextPrefix...)
	return tokenText.AppendEncode(b, raw), nil
}

// MarshalText returns the text encoding of t, for HTTP headers and gRPC
// metadata.
func (t Token) MarshalText() ([]byte, error) {
	return t.AppendText(make([]byte, 0, len(tokenTextPrefix)+tokenText.EncodedLen(encodedSize(t))))
}

// UnmarshalText sets *t to the token in its text encoding. On error *t is
// unchanged.
func (t *Token) UnmarshalText(b []byte) error {
	u, err := ParseTokenText(string(b))
	if err != nil {
		return err
	}
	*t = u
	return nil
}

// ParseTokenText decodes a token's text encoding. Any input that is not the
// canonical text of a token yields an error wrapping ErrMalformedToken.
func ParseTokenText(s string) (Token, error) {
	if len(s) > MaxTokenTextSize {
		return Token{}, malformed("text is %d bytes, at most %d", len(s), MaxTokenTextSize)
	}
	payload, ok := strings.CutPrefix(s, tokenTextPrefix)
	if !ok {
		return Token{}, malformed("text does not start with %q", tokenTextPrefix)
	}
	// The base64 decoder skips CR and LF; a canonical text has neither.
	if strings.ContainsAny(payload, "\r\n") {
		return Token{}, malformed("line break in text")
	}
	var src [MaxTokenTextSize]byte
	var buf [MaxTokenSize]byte
	n, err := tokenText.Decode(buf[:], src[:copy(src[:], payload)])
	if err != nil {
		return Token{}, malformed("text: %v", err)
	}
	return ParseToken(buf[:n])
}

func encodedSize(t Token) int {
	n := 2 + uvarintLen(uint64(t.Partition)) + uvarintLen(t.Epoch) + uvarintLen(t.Incarnation) + 1 + len(t.Owner)
	if t.MAC != ([MACSize]byte{}) {
		n += MACSize
	}
	return n
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// appendToken appends the encoding of t, with the release flag set if
// released (a Claim's encoding).
func appendToken(b []byte, t Token, released bool) ([]byte, error) {
	if len(t.Owner) > MaxOwnerSize {
		return b, malformed("owner is %d bytes, at most %d", len(t.Owner), MaxOwnerSize)
	}
	flags := encodeFlags(&t, released)
	b = append(b, tokenVersion, flags)
	b = binary.AppendUvarint(b, uint64(t.Partition))
	b = binary.AppendUvarint(b, t.Epoch)
	b = binary.AppendUvarint(b, t.Incarnation)
	b = append(b, byte(len(t.Owner)))
	b = append(b, t.Owner...)
	if flags&tokenFlagMAC != 0 {
		b = append(b, t.MAC[:]...)
	}
	return b, nil
}

// encodeFlags returns the flags byte of the encodings of t and of its claims:
// tokenFlagMAC if t is signed, claimFlagReleased if released.
func encodeFlags(t *Token, released bool) byte {
	var f byte
	if t.MAC != ([MACSize]byte{}) {
		f |= tokenFlagMAC
	}
	if released {
		f |= claimFlagReleased
	}
	return f
}

// decodeToken decodes a token whose flags may include the extra bits in
// allowed, and returns those bits.
func decodeToken(b []byte, allowed byte) (Token, byte, error) {
	d := decoder{b: b}
	if v := d.byte(); d.ok() && v != tokenVersion {
		return Token{}, 0, malformed("unknown version %d", v)
	}
	flags := d.byte()
	if d.ok() && flags&^(tokenFlagMAC|allowed) != 0 {
		return Token{}, 0, malformed("unknown flags %#x", flags)
	}
	var t Token
	p := d.uvarint()
	if p > math.MaxUint32 {
		return Token{}, 0, malformed("partition %d out of range", p)
	}
	t.Partition = uint32(p)
	t.Epoch = d.uvarint()
	t.Incarnation = d.uvarint()
	t.Owner = string(d.bytes(int(d.byte())))
	if flags&tokenFlagMAC != 0 {
		copy(t.MAC[:], d.bytes(MACSize))
		if d.ok() && t.MAC == ([MACSize]byte{}) {
			return Token{}, 0, malformed("MAC flag with an all-zero MAC")
		}
	}
	if err := d.end(); err != nil {
		return Token{}, 0, err
	}
	return t, flags &^ tokenFlagMAC, nil
}

// decoder reads the fields of a canonical encoding. The first fault sticks;
// later reads return zero values. (The fault is a plain value so that the
// bytes decoded never escape through the error.)
type decoder struct {
	b     []byte
	fault decodeFault
}

type decodeFault uint8

const (
	faultNone decodeFault = iota
	faultTruncated
	faultOverflow
	faultNonMinimal
	faultTrailing
	faultInvalid
)

func (f decodeFault) String() string {
	switch f {
	case faultTruncated:
		return "truncated"
	case faultOverflow:
		return "uvarint overflows 64 bits"
	case faultNonMinimal:
		return "non-minimal uvarint"
	case faultTrailing:
		return "trailing bytes"
	case faultInvalid:
		return "invalid stable membership"
	}
	return "ok"
}

func (d *decoder) fail(f decodeFault) {
	if d.fault == faultNone {
		d.fault = f
	}
}

// ok reports whether every read so far succeeded.
func (d *decoder) ok() bool { return d.fault == faultNone }

// err returns the first fault as an error, or nil.
func (d *decoder) err() error {
	if d.fault == faultNone {
		return nil
	}
	return malformed("%v", d.fault)
}

func (d *decoder) byte() byte {
	if !d.ok() {
		return 0
	}
	if len(d.b) == 0 {
		d.fail(faultTruncated)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bytes(n int) []byte {
	if !d.ok() {
		return nil
	}
	if len(d.b) < n {
		d.fail(faultTruncated)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// uvarint reads a minimal uvarint.
func (d *decoder) uvarint() uint64 {
	if !d.ok() {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	switch {
	case n == 0:
		d.fail(faultTruncated)
		return 0
	case n < 0:
		d.fail(faultOverflow)
		return 0
	case n > 1 && d.b[n-1] == 0:
		d.fail(faultNonMinimal)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// end reports the first fault, or trailing bytes.
func (d *decoder) end() error {
	if d.ok() && len(d.b) != 0 {
		d.fail(faultTrailing)
	}
	return d.err()
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformedToken, fmt.Sprintf(format, args...))
}
