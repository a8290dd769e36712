package coordinator

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestStatusPageAndMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "s", 2)
	a := tc.node("s0")

	srv := httptest.NewServer(a.c.StatusHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/?format=json")
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if st.Node != "s0" || len(st.Members) != 2 || len(st.Partitions) != testPartitions || !st.Converged {
		t.Fatalf("status = %+v", st)
	}
	local := 0
	for _, p := range st.Partitions {
		if p.Local {
			local++
			if p.Owner != "s0" || p.Holder != "s0" || p.Epoch == 0 {
				t.Fatalf("local partition row %+v", p)
			}
		}
	}
	if local == 0 || local != st.Owned {
		t.Fatalf("%d local rows, owned %d", local, st.Owned)
	}
	resp, err = http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	var page strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		page.Write(buf[:n])
		if err != nil {
			break
		}
	}
	resp.Body.Close()
	if !strings.Contains(page.String(), "tenure node s0") || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatal("HTML status page missing")
	}

	reg := prometheus.NewRegistry()
	if err := reg.Register(a.c.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				got[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["tenure_members"] != 2 || got["tenure_owned_partitions"] != float64(st.Owned) || got["tenure_claims_total"] == 0 {
		t.Fatalf("metrics = %v", got)
	}
}
