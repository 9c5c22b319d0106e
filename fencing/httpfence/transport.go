package httpfence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// ErrNoLease is matched (errors.Is) by the error of a request sent through a
// Transport whose context carries no lease.
var ErrNoLease = errors.New("httpfence: the request's context carries no lease")

// Transport is the client side: an http.RoundTripper that sends the token of
// the lease in each request's context (dlock.Do's ctx carries it; see
// dlock.LeaseFromContext). It sends the token even if the lease has ended:
// the server, not the client, decides whether it is still current.
type Transport struct {
	// Base sends the requests. Default: http.DefaultTransport.
	Base http.RoundTripper

	// IfMatch sends the token as If-Match: "dlock-<token>" (see ETag)
	// instead of in TokenHeader. Default false.
	IfMatch bool

	// Lease picks the lease whose token a request carries. Default: the
	// innermost lease of the request's context (dlock.LeaseFromContext).
	Lease func(*http.Request) *dlock.Lease
}

// RoundTrip sends a copy of req with the token set. A request whose context
// carries no lease is not sent: the error matches ErrNoLease.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var lease *dlock.Lease
	if t.Lease != nil {
		lease = t.Lease(req)
	} else {
		lease = dlock.LeaseFromContext(req.Context())
	}
	if lease == nil {
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper must close the body, even on errors
		}
		return nil, fmt.Errorf("%w (%s %s)", ErrNoLease, req.Method, req.URL.Redacted())
	}
	out := req.Clone(req.Context())
	if t.IfMatch {
		out.Header.Set("If-Match", ETag(lease.Token()))
	} else {
		out.Header.Set(TokenHeader, strconv.FormatUint(uint64(lease.Token()), 10))
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(out)
}

// maxRejectionBody bounds what CheckResponse reads of a rejection's body.
const maxRejectionBody = 4 << 10

// CheckResponse returns a *fencing.StaleTokenError (it matches
// fencing.ErrStaleToken) if resp is a Fence's refusal of a stale token, and
// nil otherwise. It reads a refusal's small body and leaves resp.Body
// readable from the start.
func CheckResponse(resp *http.Response) error {
	if resp.StatusCode != http.StatusConflict && resp.StatusCode != http.StatusPreconditionFailed {
		return nil
	}
	cur := resp.Header.Get(CurrentHeader)
	if cur == "" {
		return nil
	}
	highest, err := strconv.ParseUint(cur, 10, 64)
	if err != nil {
		return nil
	}
	e := &fencing.StaleTokenError{Highest: dlock.Token(highest)}
	if resp.Body != nil {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxRejectionBody))
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), resp.Body), resp.Body}
		var body rejection
		if json.Unmarshal(b, &body) == nil {
			e.Resource, e.Token = body.Resource, dlock.Token(body.Token)
		}
	}
	return e
}
