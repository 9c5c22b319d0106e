// Package httpfence fences HTTP services by dlock's fencing tokens: server
// middleware that refuses a request carrying a token older than the newest it
// has accepted for the same resource, and a client RoundTripper that sends the
// token of the lease in the request's context.
//
// # The wire form
//
// A client sends its token in the request header Dlock-Fencing-Token (a
// decimal integer), or, where a service prefers preconditions, as the strong
// entity tag "dlock-<token>" in If-Match. A stale token is answered with 409
// Conflict (412 Precondition Failed in the If-Match form, with the current
// token's tag in ETag); both carry the highest accepted token in the header
// Dlock-Fencing-Current and a small JSON body:
//
//	{"error":"stale fencing token","resource":"jobs/a","token":4,"current":5}
//
// A request with no token gets 428 Precondition Required; a malformed one
// 400 Bad Request.
//
// # The atomic step
//
// The handler runs inside the guarded section: the middleware accepts the
// token and serves the request under one lock per resource, so requests for
// one resource are served one at a time and no request with a lower token can
// run after a higher one was accepted. A handler must therefore finish its
// write before it returns, not in a goroutine it leaves behind.
package httpfence

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// The headers of the wire form.
const (
	// TokenHeader carries the request's fencing token, a decimal integer.
	TokenHeader = "Dlock-Fencing-Token"
	// CurrentHeader carries, on a rejection, the highest token the resource
	// has accepted.
	CurrentHeader = "Dlock-Fencing-Current"
)

// ETag returns the strong entity tag that carries token in the If-Match
// form: "dlock-<token>", quotes included.
func ETag(token dlock.Token) string {
	return `"dlock-` + strconv.FormatUint(uint64(token), 10) + `"`
}

// parseETag returns the token of a tag made by ETag.
func parseETag(s string) (dlock.Token, bool) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, `"dlock-`)
	if !ok {
		return 0, false
	}
	digits, ok := strings.CutSuffix(rest, `"`)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	return dlock.Token(n), true
}

// Guard is the check the middleware runs: Do runs write if token is at least
// the highest accepted for resource (recording it), and otherwise returns an
// error matching fencing.ErrStaleToken, as *fencing.Guard does. Do must run
// write while no other call for resource can pass its check.
type Guard interface {
	Do(resource string, token dlock.Token, write func() error) error
}

// Fence is the server side: Wrap puts it in front of a handler. The zero
// value fences each request by its URL path, in memory. Its fields must not
// change once Wrap has been called.
type Fence struct {
	// Resource names the resource a request writes. Default: the request's
	// URL path.
	Resource func(*http.Request) string

	// Guard checks and records the tokens. Default: one lock and one
	// highest token per resource, in the process's memory, forgotten when
	// the process ends; give a Guard that keeps the highest token where the
	// data is if the service's data outlives the process. (*fencing.Guard
	// fits too, with one lock for all resources.)
	Guard Guard

	// OnReject, if set, is called with every rejection of a stale token. It
	// must not block.
	OnReject func(*fencing.StaleTokenError)

	fallback memGuard
}

// rejection is the JSON body of a refused request.
type rejection struct {
	Error    string `json:"error"`
	Resource string `json:"resource,omitempty"`
	Token    uint64 `json:"token,omitempty"`
	Current  uint64 `json:"current,omitempty"`
}

// Wrap returns a handler that serves next only for requests whose token is
// current for their resource, inside the guarded section (see the package
// doc for the answers to the others). Every request through it must carry a
// token: wrap the routes that write, not those that only read.
func (f *Fence) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ifMatch, status, msg := requestToken(r)
		if status != 0 {
			writeJSON(w, status, rejection{Error: msg})
			return
		}
		resource := r.URL.Path
		if f.Resource != nil {
			resource = f.Resource(r)
		}
		g := f.Guard
		if g == nil {
			g = &f.fallback
		}
		served := false
		err := g.Do(resource, token, func() error {
			served = true
			next.ServeHTTP(w, r)
			return nil
		})
		var stale *fencing.StaleTokenError
		switch {
		case served:
		case errors.As(err, &stale):
			if f.OnReject != nil {
				f.OnReject(stale)
			}
			status := http.StatusConflict
			if ifMatch {
				status = http.StatusPreconditionFailed
				if stale.Highest != 0 {
					w.Header().Set("ETag", ETag(stale.Highest))
				}
			}
			if stale.Highest != 0 {
				w.Header().Set(CurrentHeader, strconv.FormatUint(uint64(stale.Highest), 10))
			}
			writeJSON(w, status, rejection{Error: "stale fencing token", Resource: resource,
				Token: uint64(token), Current: uint64(stale.Highest)})
		default:
			writeJSON(w, http.StatusInternalServerError, rejection{Error: "fencing check failed", Resource: resource})
		}
	})
}

// requestToken reads the request's token from TokenHeader or If-Match. A
// non-zero status is the answer to a request without a usable token.
func requestToken(r *http.Request) (token dlock.Token, ifMatch bool, status int, msg string) {
	h := r.Header.Values(TokenHeader)
	im := r.Header.Get("If-Match")
	imToken, imOK := parseETag(im)
	switch {
	case len(h) > 1:
		return 0, false, http.StatusBadRequest, "more than one " + TokenHeader + " header"
	case len(h) == 1:
		n, err := strconv.ParseUint(strings.TrimSpace(h[0]), 10, 64)
		if err != nil {
			return 0, false, http.StatusBadRequest, "malformed " + TokenHeader + " header"
		}
		if imOK && dlock.Token(n) != imToken {
			return 0, false, http.StatusBadRequest, TokenHeader + " and If-Match name different tokens"
		}
		return dlock.Token(n), false, 0, ""
	case imOK:
		return imToken, true, 0, ""
	case strings.Contains(im, `"dlock-`):
		return 0, true, http.StatusBadRequest, "malformed fencing token in If-Match"
	}
	return 0, false, http.StatusPreconditionRequired, "missing fencing token (" + TokenHeader + " or If-Match)"
}

func writeJSON(w http.ResponseWriter, status int, body rejection) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// memGuard is Fence's default Guard: one lock and one highest token per
// resource. A resource's entry is dropped when no request holds it, once its
// token was recorded in highest.
type memGuard struct {
	mu      sync.Mutex
	locks   map[string]*resourceLock
	highest map[string]dlock.Token
}

type resourceLock struct {
	mu   sync.Mutex
	refs int // guarded by memGuard.mu
}

// Do implements Guard: token 0 and a token below the highest are refused
// with a *fencing.StaleTokenError; write runs under the resource's lock.
func (g *memGuard) Do(resource string, token dlock.Token, write func() error) error {
	g.mu.Lock()
	if g.locks == nil {
		g.locks = map[string]*resourceLock{}
		g.highest = map[string]dlock.Token{}
	}
	l := g.locks[resource]
	if l == nil {
		l = &resourceLock{}
		g.locks[resource] = l
	}
	l.refs++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(g.locks, resource)
		}
		g.mu.Unlock()
	}()

	l.mu.Lock()
	defer l.mu.Unlock()
	g.mu.Lock()
	hi := g.highest[resource]
	if token == 0 || token < hi {
		g.mu.Unlock()
		return &fencing.StaleTokenError{Resource: resource, Token: token, Highest: hi}
	}
	g.highest[resource] = token
	g.mu.Unlock()
	return write()
}
