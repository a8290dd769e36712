package ownership_test

import (
	"fmt"

	"github.com/tenure-go/tenure/ownership"
)

// A token travels in an HTTP header or gRPC metadata in its text form.
func ExampleParseTokenText() {
	tok := ownership.Token{Partition: 12, Epoch: 3, Owner: "node-a", Incarnation: 0xbeef}
	text, _ := tok.MarshalText()
	fmt.Println(string(text))

	back, err := ownership.ParseTokenText(string(text))
	fmt.Println(back, err)

	_, err = ownership.ParseTokenText("v1.not-a-token")
	fmt.Println(err != nil)
	// Output:
	// v1.AQAMA-_9AgZub2RlLWE
	// p12@e3:node-a/000000000000beef <nil>
	// true
}

// A keyring signs tokens where they are minted and verifies them where they
// are checked; a token whose MAC fails is rejected with ErrBadMAC.
func ExampleKeyring() {
	key := ownership.Key("0123456789abcdef0123456789abcdef") // use 32 random bytes
	keys, err := ownership.NewKeyring(key)
	if err != nil {
		panic(err)
	}
	tok := keys.Sign(ownership.Token{Partition: 1, Epoch: 9, Owner: "node-a", Incarnation: 1})
	fmt.Println(keys.Verify(tok))

	forged := tok
	forged.Epoch = 1 << 40
	fmt.Println(keys.Verify(forged) != nil)
	// Output:
	// <nil>
	// true
}
