package httpfence_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/httpfence"
)

// A service fences its write route with a Fence; a job calls it through a
// Transport, which sends the token of the lease in the request's context
// (dlock.Do's ctx carries it). A call with an older token than one the
// service has accepted is refused with 409 and the current token.
func Example() {
	// The service: PUT /reports/<name>, served only for a current token.
	fence := &httpfence.Fence{} // resource: the URL path
	srv := httptest.NewServer(fence.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent) // the write, inside the guarded section
	})))
	defer srv.Close()

	// The job.
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://")
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	client := &http.Client{Transport: &httpfence.Transport{}}
	call := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/reports/daily", strings.NewReader("done"))
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return httpfence.CheckResponse(resp) // a refusal is a *fencing.StaleTokenError
	}
	var first *dlock.Lease
	for range 2 {
		err = dlock.Do(ctx, locker, "reports/daily", func(ctx context.Context, lease *dlock.Lease) error {
			if first == nil {
				first = lease
			}
			return call(ctx)
		})
		fmt.Println("holder's call:", err)
	}
	// The first holder, late: its ctx still carries its lease, and its token.
	err = call(dlock.ContextWithLease(ctx, first))
	fmt.Println("late call refused:", errors.Is(err, fencing.ErrStaleToken))
	// Output:
	// holder's call: <nil>
	// holder's call: <nil>
	// late call refused: true
}
