package transport

import (
	"testing"
	"time"
)

func TestKeepaliveValidate(t *testing.T) {
	if err := DefaultKeepalive().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, tweak := range map[string]func(*Keepalive){
		"pings faster than the server allows": func(k *Keepalive) { k.ClientTime = k.ServerMinTime - time.Second },
		"below gRPC's minimum":                func(k *Keepalive) { k.ClientTime, k.ServerMinTime = 5*time.Second, time.Second },
		"zero timeout":                        func(k *Keepalive) { k.ClientTimeout = 0 },
		"negative server time":                func(k *Keepalive) { k.ServerTime = -1 },
	} {
		k := DefaultKeepalive()
		tweak(&k)
		if k.Validate() == nil {
			t.Errorf("%s: valid", name)
		}
	}
	k := DefaultKeepalive()
	if len(k.ServerOptions()) != 2 || len(k.DialOptions()) != 1 {
		t.Fatal("keepalive options")
	}
}
