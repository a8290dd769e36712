package ownership

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
)

func codecTokens() []Token {
	mac := [MACSize]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	return []Token{
		{},
		{Partition: 3, Epoch: 1, Owner: "node-a", Incarnation: 0x1234},
		{Partition: math.MaxUint32, Epoch: math.MaxUint64, Owner: strings.Repeat("x", MaxOwnerSize), Incarnation: math.MaxUint64, MAC: mac},
		{Partition: 127, Epoch: 128, Owner: "", Incarnation: 16384},
		{Partition: 0, Epoch: 7, Owner: "ünïcode", Incarnation: 1, MAC: [MACSize]byte{15: 1}},
		{Owner: "\x00\xff not utf-8"},
	}
}

func TestTokenBinaryRoundTrip(t *testing.T) {
	for _, tok := range codecTokens() {
		b, err := tok.MarshalBinary()
		if err != nil {
			t.Fatalf("%v: %v", tok, err)
		}
		if len(b) > MaxTokenSize {
			t.Errorf("%v: %d bytes, above MaxTokenSize %d", tok, len(b), MaxTokenSize)
		}
		if len(b) != encodedSize(tok) || cap(b) != len(b) {
			t.Errorf("%v: len %d cap %d, encodedSize %d", tok, len(b), cap(b), encodedSize(tok))
		}
		got, err := ParseToken(b)
		if err != nil || got != tok {
			t.Errorf("ParseToken(%x) = %v, %v; want %v", b, got, err, tok)
		}
		var u Token
		if err := u.UnmarshalBinary(b); err != nil || u != tok {
			t.Errorf("UnmarshalBinary = %v, %v", u, err)
		}
		app, _ := tok.AppendBinary([]byte("pre"))
		if !bytes.Equal(app, append([]byte("pre"), b...)) {
			t.Errorf("AppendBinary does not append: %x", app)
		}
	}
}

func TestTokenTextRoundTrip(t *testing.T) {
	for _, tok := range codecTokens() {
		text, err := tok.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		if len(text) > MaxTokenTextSize {
			t.Errorf("%d bytes, above MaxTokenTextSize %d", len(text), MaxTokenTextSize)
		}
		for _, c := range string(text) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.", c)) {
				t.Errorf("%q: character %q is not header-safe", text, c)
			}
		}
		got, err := ParseTokenText(string(text))
		if err != nil || got != tok {
			t.Errorf("ParseTokenText(%q) = %v, %v; want %v", text, got, err, tok)
		}
		var u Token
		if err := u.UnmarshalText(text); err != nil || u != tok {
			t.Errorf("UnmarshalText = %v, %v", u, err)
		}
	}
	long := Token{Partition: math.MaxUint32, Epoch: math.MaxUint64, Incarnation: math.MaxUint64,
		Owner: strings.Repeat("x", MaxOwnerSize), MAC: [MACSize]byte{1}}
	text, _ := long.MarshalText()
	if len(text) != MaxTokenTextSize {
		t.Errorf("largest token: %d text bytes, MaxTokenTextSize %d", len(text), MaxTokenTextSize)
	}
	raw, _ := long.MarshalBinary()
	if len(raw) != MaxTokenSize {
		t.Errorf("largest token: %d bytes, MaxTokenSize %d", len(raw), MaxTokenSize)
	}
}

// A fixed encoding, so a format change can't go unnoticed.
func TestTokenGoldenEncoding(t *testing.T) {
	tok := Token{Partition: 300, Epoch: 2, Owner: "ab", Incarnation: 1}
	b, _ := tok.MarshalBinary()
	if got, want := hex.EncodeToString(b), "0100ac020201026162"; got != want {
		t.Errorf("binary %s, want %s", got, want)
	}
	text, _ := tok.MarshalText()
	if got, want := string(text), "v1.AQCsAgIBAmFi"; got != want {
		t.Errorf("text %s, want %s", got, want)
	}
}

func TestTokenEncodeOwnerTooLong(t *testing.T) {
	tok := Token{Epoch: 1, Owner: strings.Repeat("x", MaxOwnerSize+1)}
	if _, err := tok.MarshalBinary(); !errors.Is(err, ErrMalformedToken) {
		t.Errorf("MarshalBinary: %v", err)
	}
	if _, err := tok.MarshalText(); !errors.Is(err, ErrMalformedToken) {
		t.Errorf("MarshalText: %v", err)
	}
}

func TestParseTokenRejects(t *testing.T) {
	valid := "0100ac020201026162" // p300 e2 inc1 "ab"
	cases := map[string]string{
		"empty":               "",
		"version 0":           "0000ac020201026162",
		"version 2":           "0200ac020201026162",
		"unknown flag":        "0104ac020201026162",
		"released flag":       "0102ac020201026162",
		"trailing byte":       valid + "00",
		"non-minimal varint":  "0100ac02820001026162",
		"non-minimal zero":    "010080000201026162",
		"partition > 2^32-1":  "01008080808010020100",
		"varint overflow":     "0100ffffffffffffffffff7f020100",
		"owner truncated":     "0100ac0202010261",
		"MAC truncated":       "0101ac020201026162" + "01",
		"MAC flag, zero MAC":  "0101ac020201026162" + strings.Repeat("00", MACSize),
		"owner length > rest": "0100ac020201ff",
	}
	for name, h := range cases {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(name, err)
		}
		if tok, err := ParseToken(b); !errors.Is(err, ErrMalformedToken) {
			t.Errorf("%s: ParseToken(%s) = %v, %v", name, h, tok, err)
		}
	}
	full, _ := hex.DecodeString(valid)
	if _, err := ParseToken(full); err != nil {
		t.Fatalf("valid: %v", err)
	}
	for i := range full {
		if _, err := ParseToken(full[:i]); !errors.Is(err, ErrMalformedToken) {
			t.Errorf("prefix of %d bytes: %v", i, err)
		}
	}
	u := Token{Epoch: 9}
	if err := u.UnmarshalBinary(nil); err == nil || u.Epoch != 9 {
		t.Errorf("failed UnmarshalBinary changed the token or succeeded: %v %v", u, err)
	}
}

func TestParseTokenTextRejects(t *testing.T) {
	// "v1.AQCsAgIBAmFi" is p300 e2 inc1 "ab"; "v1.AQCsAgIBA2FiYw" has owner "abc".
	for _, s := range []string{"v1.AQCsAgIBAmFi", "v1.AQCsAgIBA2FiYw"} {
		if _, err := ParseTokenText(s); err != nil {
			t.Fatalf("valid %q: %v", s, err)
		}
	}
	cases := map[string]string{
		"empty":          "",
		"prefix only":    "v1.",
		"no prefix":      "AQCsAgIBAmFi",
		"v2":             "v2.AQCsAgIBAmFi",
		"padding":        "v1.AQCsAgIBA2FiYw==",
		"std alphabet":   "v1.AQCsAgIBAmF+",
		"newline":        "v1.AQCsAgIB\nAmFi",
		"carriage":       "v1.AQCsAgIBAmFi\r",
		"space":          "v1.AQCsAgIBAmFi ",
		"trailing bits":  "v1.AQCsAgIBA2FiYx",
		"bad length":     "v1.AQCsAgIBAmFiA",
		"too long":       "v1." + strings.Repeat("A", MaxTokenTextSize),
		"bad binary":     "v1.AA",
		"trailing bytes": "v1.AQCsAgIBAmFiAA",
	}
	for name, s := range cases {
		if tok, err := ParseTokenText(s); !errors.Is(err, ErrMalformedToken) {
			t.Errorf("%s: ParseTokenText(%q) = %v, %v", name, s, tok, err)
		}
	}
}

// decodeFailed reports whether a decoder returned an error, and fails t if
// the error does not wrap ErrMalformedToken.
func decodeFailed(t *testing.T, err error) bool {
	t.Helper()
	if err != nil && !errors.Is(err, ErrMalformedToken) {
		t.Fatalf("error %v does not wrap ErrMalformedToken", err)
	}
	return err != nil
}

func FuzzParseToken(f *testing.F) {
	for _, tok := range codecTokens() {
		b, _ := tok.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1, 1, 0x80, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := ParseToken(b)
		if decodeFailed(t, err) {
			return
		}
		again, err := tok.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("%x decodes to %v, which encodes to %x, %v", b, tok, again, err)
		}
		text, err := tok.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ParseTokenText(string(text)); err != nil || back != tok {
			t.Fatalf("text round trip of %v: %v, %v", tok, back, err)
		}
	})
}

func FuzzParseTokenText(f *testing.F) {
	for _, tok := range codecTokens() {
		text, _ := tok.MarshalText()
		f.Add(string(text))
	}
	f.Add("")
	f.Add("v1.")
	f.Add("v1.AQCsAgIBA2FiYw==")
	f.Add("v1.AQCsAgIB\nAmFi")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseTokenText(s)
		if decodeFailed(t, err) {
			return
		}
		again, err := tok.MarshalText()
		if err != nil || string(again) != s {
			t.Fatalf("%q decodes to %v, which encodes to %q, %v", s, tok, again, err)
		}
	})
}

// benchToken is a signed token with a typical owner name.
var benchToken = Token{Partition: 17, Epoch: 12345, Owner: "node-7.example", Incarnation: 0x9e3779b97f4a7c15, MAC: [MACSize]byte{1}}

func BenchmarkTokenMarshal(b *testing.B) {
	tok := benchToken
	var buf [MaxTokenSize]byte
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tok.AppendBinary(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTokenParse(b *testing.B) {
	tok := benchToken
	raw, _ := tok.MarshalBinary()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseToken(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTokenMarshalText(b *testing.B) {
	tok := benchToken
	var buf [MaxTokenTextSize]byte
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tok.AppendText(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTokenParseText(b *testing.B) {
	tok := benchToken
	text, _ := tok.MarshalText()
	s := string(text)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseTokenText(s); err != nil {
			b.Fatal(err)
		}
	}
}
