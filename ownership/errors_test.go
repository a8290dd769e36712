package ownership

import (
	"errors"
	"testing"
)

// A token above the mark is refused with the mark as Current, the name every
// error that reports the mark gives it, and as the deprecated Mark too.
func TestNotFencedErrorCarriesTheMark(t *testing.T) {
	mark := Token{Partition: 2, Epoch: 3, Owner: "a", Incarnation: 1}
	above := Token{Partition: 2, Epoch: 4, Owner: "b", Incarnation: 1}
	var nf *NotFencedError
	if err := Judge(above, mark); !errors.As(err, &nf) || !errors.Is(err, ErrNotFenced) {
		t.Fatalf("Judge(%v, %v) = %v, want a NotFencedError", above, mark, err)
	}
	if nf.Token != above || nf.Current != mark || nf.Mark != mark {
		t.Fatalf("NotFencedError{Token %v, Current %v, Mark %v}, want %v, %v, %v", nf.Token, nf.Current, nf.Mark, above, mark, mark)
	}
	var st *StaleTokenError
	if err := Judge(mark, above); !errors.As(err, &st) || st.Current != above {
		t.Fatalf("Judge(%v, %v) = %v, want a StaleTokenError with Current %v", mark, above, err, above)
	}
}
