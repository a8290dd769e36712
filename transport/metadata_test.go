package transport

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

func TestKeyFromMetadata(t *testing.T) {
	for _, tc := range []struct {
		name string
		md   metadata.MD
		want string
		code codes.Code
	}{
		{"ok", metadata.Pairs(KeyMetadata, "user-42"), "user-42", codes.OK},
		{"binary", metadata.Pairs(KeyMetadata, "\x00\xff\x01"), "\x00\xff\x01", codes.OK},
		{"max size", metadata.Pairs(KeyMetadata, strings.Repeat("k", MaxKeySize)), strings.Repeat("k", MaxKeySize), codes.OK},
		{"missing", metadata.Pairs("other", "x"), "", codes.InvalidArgument},
		{"nil md", nil, "", codes.InvalidArgument},
		{"empty", metadata.Pairs(KeyMetadata, ""), "", codes.InvalidArgument},
		{"repeated", metadata.Pairs(KeyMetadata, "a", KeyMetadata, "b"), "", codes.InvalidArgument},
		{"oversized", metadata.Pairs(KeyMetadata, strings.Repeat("k", MaxKeySize+1)), "", codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := KeyFromMetadata(tc.md)
			if status.Code(err) != tc.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tc.code)
			}
			if string(got) != tc.want {
				t.Fatalf("key %q, want %q", got, tc.want)
			}
		})
	}
}

func testToken() ownership.Token {
	return ownership.Token{Partition: 5, Epoch: 9, Owner: "node-a", Incarnation: 0xabc}
}

func tokenString(t testing.TB, tok ownership.Token) string {
	t.Helper()
	b, err := tok.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestTokenFromMetadata(t *testing.T) {
	good := tokenString(t, testToken())
	for _, tc := range []struct {
		name   string
		md     metadata.MD
		wantOK bool
		code   codes.Code
	}{
		{"ok", metadata.Pairs(TokenMetadata, good), true, codes.OK},
		{"missing", metadata.MD{}, false, codes.OK},
		{"repeated", metadata.Pairs(TokenMetadata, good, TokenMetadata, good), false, codes.InvalidArgument},
		{"oversized", metadata.Pairs(TokenMetadata, "v1."+strings.Repeat("A", ownership.MaxTokenTextSize)), false, codes.InvalidArgument},
		{"garbage", metadata.Pairs(TokenMetadata, "hello"), false, codes.InvalidArgument},
		{"empty", metadata.Pairs(TokenMetadata, ""), false, codes.InvalidArgument},
		{"truncated", metadata.Pairs(TokenMetadata, good[:len(good)-2]), false, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, ok, err := TokenFromMetadata(tc.md)
			if status.Code(err) != tc.code || ok != tc.wantOK {
				t.Fatalf("ok %v code %v (%v), want %v %v", ok, status.Code(err), err, tc.wantOK, tc.code)
			}
			if ok && tok != testToken() {
				t.Fatalf("token %v, want %v", tok, testToken())
			}
		})
	}
}

func TestWithTokenAndAppendToken(t *testing.T) {
	ctx := WithToken(context.Background(), testToken())
	if got, ok := TokenFromContext(ctx); !ok || got != testToken() {
		t.Fatalf("TokenFromContext = %v %v", got, ok)
	}
	if _, ok := TokenFromContext(context.Background()); ok {
		t.Fatal("a bare context has a token")
	}
	ctx, err := AppendToken(context.Background(), testToken())
	if err != nil {
		t.Fatal(err)
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	tok, ok, err := TokenFromMetadata(md)
	if err != nil || !ok || tok != testToken() {
		t.Fatalf("round trip: %v %v %v", tok, ok, err)
	}
	bad := testToken()
	bad.Owner = strings.Repeat("x", ownership.MaxOwnerSize+1)
	if _, err := AppendToken(context.Background(), bad); err == nil {
		t.Fatal("AppendToken accepted an unencodable token")
	}
}

// fuzzMD builds metadata from fuzz input: n values of key, from the parts
// of s split at NUL.
func fuzzMD(key, s string, n uint8) metadata.MD {
	md := metadata.MD{}
	parts := strings.Split(s, "\x00")
	for i := 0; i < int(n%4) && i < len(parts); i++ {
		md[key] = append(md[key], parts[i])
	}
	return md
}

func FuzzKeyFromMetadata(f *testing.F) {
	f.Add("user-42", uint8(1))
	f.Add("", uint8(1))
	f.Add("a\x00b", uint8(2))
	f.Add(strings.Repeat("k", MaxKeySize+1), uint8(1))
	f.Add("x", uint8(0))
	f.Fuzz(func(t *testing.T, s string, n uint8) {
		md := fuzzMD(KeyMetadata, s, n)
		key, err := KeyFromMetadata(md)
		vals := md.Get(KeyMetadata)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error with code %v: %v", status.Code(err), err)
			}
			if len(vals) == 1 && len(vals[0]) > 0 && len(vals[0]) <= MaxKeySize {
				t.Fatalf("valid key %q refused: %v", vals[0], err)
			}
			return
		}
		if len(vals) != 1 || string(key) != vals[0] {
			t.Fatalf("key %q from %q", key, vals)
		}
	})
}

func FuzzTokenFromMetadata(f *testing.F) {
	good := tokenString(f, testToken())
	signed, _ := ownership.NewKeyring(ownership.Key(strings.Repeat("k", 32)))
	f.Add(good, uint8(1))
	f.Add(tokenString(f, signed.Sign(testToken())), uint8(1))
	f.Add(good+"\x00"+good, uint8(2))
	f.Add("v1.", uint8(1))
	f.Add("v1.AQ", uint8(1))
	f.Add("v2."+good[3:], uint8(1))
	f.Add(good[:len(good)-1]+"\n", uint8(1))
	f.Fuzz(func(t *testing.T, s string, n uint8) {
		md := fuzzMD(TokenMetadata, s, n)
		tok, ok, err := TokenFromMetadata(md)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || ok {
				t.Fatalf("error with code %v, ok %v: %v", status.Code(err), ok, err)
			}
			return
		}
		if !ok {
			if len(md.Get(TokenMetadata)) != 0 {
				t.Fatal("a token value was ignored")
			}
			return
		}
		// A token that decodes is canonical: it encodes back to the input.
		if back := tokenString(t, tok); back != md.Get(TokenMetadata)[0] {
			t.Fatalf("%q decodes to %v, which encodes to %q", md.Get(TokenMetadata)[0], tok, back)
		}
	})
}
