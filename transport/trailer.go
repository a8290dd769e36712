package transport

import (
	"strings"

	"google.golang.org/grpc/metadata"
)

// Trailing metadata of a not-owner answer, for clients that don't decode
// grpc-status-details-bin (grpcurl, clients in other languages): the same
// owner as the ReasonNotOwner detail, in plain text.
const (
	// OwnerMetadata carries the owner's node name.
	OwnerMetadata = "tenure-owner"
	// OwnerAddrMetadata carries the owner's service address; absent while
	// the owner has none.
	OwnerAddrMetadata = "tenure-owner-addr"
)

// NotOwnerTrailer returns the trailing metadata a server sends with err
// when err is a ReasonNotOwner status whose hint decodes (OwnerHint):
// OwnerMetadata and OwnerAddrMetadata, each value percent-encoded as
// grpc-message is (every byte outside printable ASCII, and '%', as %XX
// with two upper-case hex digits), so any name crosses HTTP/2 intact. It
// returns nil for any other error. The routing package's OwnerGuard sends
// it with its not-owner answers.
func NotOwnerTrailer(err error) metadata.MD {
	o, ok := OwnerHint(err)
	if !ok {
		return nil
	}
	md := metadata.Pairs(OwnerMetadata, percentEncode(o.Node))
	if o.Addr != "" {
		md.Set(OwnerAddrMetadata, percentEncode(o.Addr))
	}
	return md
}

// percentEncode encodes s as grpc-go encodes grpc-message.
func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}
