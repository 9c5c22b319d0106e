package httpfence_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/httpfence"
	_ "github.com/dlock-go/dlock/memlock" // registers mem://
)

// *fencing.Guard is a Guard a Fence can use.
var _ httpfence.Guard = (*fencing.Guard)(nil)

func TestMain(m *testing.M) {
	conformance.RegisterGuard("http-header", openSuiteTarget(false))
	conformance.RegisterGuard("http-if-match", openSuiteTarget(true))
	conformance.Main(m) // the paused-holder case's child process runs here
	goleak.VerifyTestMain(m)
}

// store is a resource the handler writes: the tokens of the writes it
// served, per resource, in order. Its handler does not lock: the Fence must
// serve one request of a resource at a time (the race detector checks).
type store struct {
	log map[string][]dlock.Token
}

func (s *store) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strconv.ParseUint(r.Header.Get(httpfence.TokenHeader), 10, 64)
		if tok == 0 {
			tok = uint64(mustETag(r.Header.Get("If-Match")))
		}
		v := s.log[r.URL.Path]
		runtime.Gosched() // widen the read-modify-write window
		s.log[r.URL.Path] = append(v, dlock.Token(tok))
		w.WriteHeader(http.StatusNoContent)
	})
}

func mustETag(s string) dlock.Token {
	var n uint64
	_, _ = fmt.Sscanf(s, `"dlock-%d"`, &n)
	return dlock.Token(n)
}

func newServer(t *testing.T, f *httpfence.Fence, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(f.Wrap(h))
	t.Cleanup(srv.Close)
	return srv
}

// send PUTs to srv's path with the headers hdr and returns the response, its
// body read and closed.
func send(t *testing.T, srv *httptest.Server, path string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func TestFenceRejectsStaleToken(t *testing.T) {
	s := &store{log: map[string][]dlock.Token{}}
	var rejected []*fencing.StaleTokenError
	var mu sync.Mutex
	f := &httpfence.Fence{OnReject: func(e *fencing.StaleTokenError) { mu.Lock(); rejected = append(rejected, e); mu.Unlock() }}
	srv := newServer(t, f, s.handler())

	tok := func(n int) map[string]string { return map[string]string{httpfence.TokenHeader: strconv.Itoa(n)} }
	for _, n := range []int{5, 5, 7} {
		if resp, body := send(t, srv, "/a", tok(n)); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("token %d: %s %s", n, resp.Status, body)
		}
	}
	resp, body := send(t, srv, "/a", tok(6))
	if resp.StatusCode != http.StatusConflict || resp.Header.Get(httpfence.CurrentHeader) != "7" {
		t.Fatalf("stale token 6: %s, %s=%q, %s; want 409 with current 7", resp.Status, httpfence.CurrentHeader, resp.Header.Get(httpfence.CurrentHeader), body)
	}
	var rej struct {
		Error    string `json:"error"`
		Resource string `json:"resource"`
		Token    uint64 `json:"token"`
		Current  uint64 `json:"current"`
	}
	if err := json.Unmarshal(body, &rej); err != nil || rej.Resource != "/a" || rej.Token != 6 || rej.Current != 7 {
		t.Fatalf("body %s (%v): want resource /a, token 6, current 7", body, err)
	}
	// The If-Match form: 412 with the current token's tag.
	resp, body = send(t, srv, "/a", map[string]string{"If-Match": httpfence.ETag(6)})
	if resp.StatusCode != http.StatusPreconditionFailed || resp.Header.Get("ETag") != httpfence.ETag(7) {
		t.Fatalf("stale If-Match: %s, ETag %q, %s; want 412 with %s", resp.Status, resp.Header.Get("ETag"), body, httpfence.ETag(7))
	}
	if resp, body := send(t, srv, "/a", map[string]string{"If-Match": httpfence.ETag(8)}); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("current If-Match: %s %s", resp.Status, body)
	}
	// Token 0, no token, a malformed one, two that disagree.
	for _, c := range []struct {
		hdr  map[string]string
		want int
	}{
		{tok(0), http.StatusConflict},
		{nil, http.StatusPreconditionRequired},
		{map[string]string{httpfence.TokenHeader: "x"}, http.StatusBadRequest},
		{map[string]string{"If-Match": `"dlock-x"`}, http.StatusBadRequest},
		{map[string]string{httpfence.TokenHeader: "9", "If-Match": httpfence.ETag(10)}, http.StatusBadRequest},
	} {
		if resp, body := send(t, srv, "/a", c.hdr); resp.StatusCode != c.want {
			t.Errorf("%v: %s %s; want %d", c.hdr, resp.Status, body, c.want)
		}
	}
	// Resources are independent.
	if resp, body := send(t, srv, "/b", tok(1)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("another resource: %s %s", resp.Status, body)
	}
	if got := fmt.Sprint(s.log["/a"], s.log["/b"]); got != "[5 5 7 8] [1]" {
		t.Fatalf("writes served: %s; want [5 5 7 8] [1] (no rejected request reached the handler)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rejected) != 3 {
		t.Fatalf("OnReject saw %d rejections, want 3 (6, If-Match 6, 0)", len(rejected))
	}
}

// TestFenceCheckAndWriteAreOneStep: a request that passed the check is still
// writing when a higher token arrives; the higher one must wait, so that the
// lower one's write cannot land after it.
func TestFenceCheckAndWriteAreOneStep(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	var writes []dlock.Token
	var arrived atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strconv.ParseUint(r.Header.Get(httpfence.TokenHeader), 10, 64)
		if tok == 5 {
			close(entered)
			<-release
		}
		mu.Lock()
		writes = append(writes, dlock.Token(tok))
		mu.Unlock()
	})
	fenced := (&httpfence.Fence{}).Wrap(h)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		fenced.ServeHTTP(w, r)
	}))
	defer srv.Close()

	var wg sync.WaitGroup
	status := make([]int, 2)
	for i, n := range []int{5, 6} {
		if n == 6 {
			<-entered // token 5 passed the check and is writing
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPut, srv.URL+"/r", nil)
			req.Header.Set(httpfence.TokenHeader, strconv.Itoa(n))
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			status[i] = resp.StatusCode
		}()
	}
	// Let token 6 reach the middleware (and, were it not held back, the
	// handler) before token 5's write lands.
	deadline := time.Now().Add(10 * time.Second)
	for arrived.Load() < 2 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	for i := 0; i < 1000; i++ {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(writes) != "[5 6]" || status[0] != 200 || status[1] != 200 {
		t.Fatalf("writes %v, statuses %v; want [5 6] and 200s: token 5's write must land before token 6 is accepted", writes, status)
	}
}

// TestFenceConcurrentWriters: 8 writers with random tokens; the tokens the
// handler served must never go down, and every refusal names a current token
// above the refused one.
func TestFenceConcurrentWriters(t *testing.T) {
	s := &store{log: map[string][]dlock.Token{}}
	srv := newServer(t, &httpfence.Fence{}, s.handler())
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				n := 1 + rand.IntN(60)
				req, _ := http.NewRequest(http.MethodPut, srv.URL+"/r", nil)
				req.Header.Set(httpfence.TokenHeader, strconv.Itoa(n))
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				if err := httpfence.CheckResponse(resp); err != nil {
					var se *fencing.StaleTokenError
					if !errors.As(err, &se) || int(se.Token) != n || int(se.Highest) <= n {
						t.Errorf("token %d refused with %v", n, err)
					}
				} else if resp.StatusCode != http.StatusNoContent {
					t.Errorf("token %d: %s", n, resp.Status)
				}
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	log := s.log["/r"]
	for i := 1; i < len(log); i++ {
		if log[i] < log[i-1] {
			t.Fatalf("write %d has token %d after token %d was served: %v", i, log[i], log[i-1], log)
		}
	}
	if len(log) == 0 {
		t.Fatal("no write was served")
	}
}

func TestTransportSendsLeaseToken(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	defer srv.Close()

	for _, ifMatch := range []bool{false, true} {
		client := &http.Client{Transport: &httpfence.Transport{Base: srv.Client().Transport, IfMatch: ifMatch}}
		err = dlock.Do(ctx, l, "jobs/a", func(ctx context.Context, lease *dlock.Lease) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			h := <-got
			if ifMatch {
				if h.Get("If-Match") != httpfence.ETag(lease.Token()) || h.Get(httpfence.TokenHeader) != "" {
					return fmt.Errorf("If-Match form sent %v; want If-Match %s only", h, httpfence.ETag(lease.Token()))
				}
			} else if h.Get(httpfence.TokenHeader) != strconv.FormatUint(uint64(lease.Token()), 10) {
				return fmt.Errorf("sent %s=%q; want the lease's token %d", httpfence.TokenHeader, h.Get(httpfence.TokenHeader), lease.Token())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	client := &http.Client{Transport: &httpfence.Transport{Base: srv.Client().Transport}}
	if _, err := client.Get(srv.URL); !errors.Is(err, httpfence.ErrNoLease) {
		t.Fatalf("a request without a lease: %v; want ErrNoLease", err)
	}
}

// TestLateHolderRefused: a holder whose lease expired writes after the next
// holder did, with the ctx that still carries its lease; the Fence refuses it
// and CheckResponse reports both tokens.
func TestLateHolderRefused(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := &store{log: map[string][]dlock.Token{}}
	srv := newServer(t, &httpfence.Fence{}, s.handler())
	client := &http.Client{Transport: &httpfence.Transport{Base: srv.Client().Transport}}
	put := func(ctx context.Context) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/jobs/a", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	old, err := l.Acquire(ctx, "jobs/a", dlock.WithTTL(50*time.Millisecond), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	<-old.Done() // expired: the next holder may be granted
	next, err := l.Acquire(ctx, "jobs/a")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	resp := put(dlock.ContextWithLease(ctx, next))
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("the holder's write: %s", resp.Status)
	}
	resp = put(dlock.ContextWithLease(ctx, old))
	defer resp.Body.Close()
	err = httpfence.CheckResponse(resp)
	var se *fencing.StaleTokenError
	if !errors.As(err, &se) || se.Token != old.Token() || se.Highest != next.Token() || se.Resource != "/jobs/a" {
		t.Fatalf("the late holder's write: %s, %v; want a StaleTokenError for %d below %d", resp.Status, err, old.Token(), next.Token())
	}
	if b, _ := io.ReadAll(resp.Body); len(b) == 0 {
		t.Fatal("CheckResponse consumed the body")
	}
	if fmt.Sprint(s.log["/jobs/a"]) != fmt.Sprint([]dlock.Token{next.Token()}) {
		t.Fatalf("writes %v; want the holder's alone", s.log["/jobs/a"])
	}
}
