package httpfence_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/fencing/httpfence"
)

// BenchmarkWrite compares a PUT through a Fence with the same PUT to the bare
// handler, on one loopback server each. Compare the two with benchstat; never
// assert on the numbers.
func BenchmarkWrite(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"plain", h}, {"guarded", (&httpfence.Fence{}).Wrap(h)}} {
		b.Run(c.name, func(b *testing.B) {
			srv := httptest.NewServer(c.h)
			defer srv.Close()
			client := srv.Client()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPut, srv.URL+"/bench", strings.NewReader("v"))
				req.Header.Set(httpfence.TokenHeader, "1")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					b.Fatal(resp.Status)
				}
			}
		})
	}
}
