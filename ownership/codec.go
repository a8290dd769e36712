package ownership

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strings"

	"github.com/tenure-go/tenure/ownership/internal/wire"
)

// Token encodings.
//
// Binary, version 1 (the same layout carries a gossip.Claim, with flag bit 1
// set for a release):
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
)

var tokenText = base64.RawURLEncoding.Strict()

// AppendBinary appends the binary encoding of t to b. It fails, wrapping
// ErrMalformedToken, only when the owner is longer than MaxOwnerSize.
func (t Token) AppendBinary(b []byte) ([]byte, error) {
	if len(t.Owner) > MaxOwnerSize {
		return b, wire.Malformed("owner is %d bytes, at most %d", len(t.Owner), MaxOwnerSize)
	}
	flags := wire.Flags(t.MAC != [MACSize]byte{}, false)
	b = append(b, tokenVersion, flags)
	b = binary.AppendUvarint(b, uint64(t.Partition))
	b = binary.AppendUvarint(b, t.Epoch)
	b = binary.AppendUvarint(b, t.Incarnation)
	b = append(b, byte(len(t.Owner)))
	b = append(b, t.Owner...)
	if flags&wire.FlagMAC != 0 {
		b = append(b, t.MAC[:]...)
	}
	return b, nil
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
		return Token{}, wire.Malformed("text is %d bytes, at most %d", len(s), MaxTokenTextSize)
	}
	payload, ok := strings.CutPrefix(s, tokenTextPrefix)
	if !ok {
		return Token{}, wire.Malformed("text does not start with %q", tokenTextPrefix)
	}
	// The base64 decoder skips CR and LF; a canonical text has neither.
	if strings.ContainsAny(payload, "\r\n") {
		return Token{}, wire.Malformed("line break in text")
	}
	var src [MaxTokenTextSize]byte
	var buf [MaxTokenSize]byte
	n, err := tokenText.Decode(buf[:], src[:copy(src[:], payload)])
	if err != nil {
		return Token{}, wire.Malformed("text: %v", err)
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

// ParseToken decodes a token's binary encoding. Any input that is not the
// canonical encoding of a token yields an error wrapping ErrMalformedToken.
func ParseToken(b []byte) (Token, error) {
	d := wire.Decoder{B: b}
	if v := d.Byte(); d.OK() && v != tokenVersion {
		return Token{}, wire.Malformed("unknown version %d", v)
	}
	flags := d.Byte()
	if d.OK() && flags&^wire.FlagMAC != 0 {
		return Token{}, wire.Malformed("unknown flags %#x", flags)
	}
	var t Token
	p := d.Uvarint()
	if p > math.MaxUint32 {
		return Token{}, wire.Malformed("partition %d out of range", p)
	}
	t.Partition = uint32(p)
	t.Epoch = d.Uvarint()
	t.Incarnation = d.Uvarint()
	t.Owner = string(d.Bytes(int(d.Byte())))
	if flags&wire.FlagMAC != 0 {
		copy(t.MAC[:], d.Bytes(MACSize))
		if d.OK() && t.MAC == ([MACSize]byte{}) {
			return Token{}, wire.Malformed("MAC flag with an all-zero MAC")
		}
	}
	if err := d.End(); err != nil {
		return Token{}, err
	}
	return t, nil
}
