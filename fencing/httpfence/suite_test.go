package httpfence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/fencing/httpfence"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/redis" // the paused-holder case's lock service
)

// valueService is the guarded HTTP service of the guard suite: PUT
// /v/<resource> stores the body, fenced by httpfence; GET reads it unfenced.
type valueService struct {
	mu     sync.Mutex // the reads' lock; writes are serialised by the Fence
	values map[string]string
}

func newValueService(f *httpfence.Fence) http.Handler {
	s := &valueService{values: map[string]string{}}
	put := f.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.values[r.URL.Path] = string(b)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPut:
			put.ServeHTTP(w, r)
		case http.MethodGet:
			s.mu.Lock()
			v := s.values[r.URL.Path]
			s.mu.Unlock()
			_, _ = io.WriteString(w, v)
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	})
}

// suiteTarget is a conformance.GuardTarget: a client of a valueService.
type suiteTarget struct {
	client  *http.Client
	tr      *http.Transport
	url     string
	ifMatch bool
}

func (t *suiteTarget) Write(ctx context.Context, token dlock.Token, value string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, t.url, strings.NewReader(value))
	if err != nil {
		return err
	}
	if t.ifMatch {
		req.Header.Set("If-Match", httpfence.ETag(token))
	} else {
		req.Header.Set(httpfence.TokenHeader, strconv.FormatUint(uint64(token), 10))
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := httpfence.CheckResponse(resp); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("PUT %s: %s %s", t.url, resp.Status, b)
	}
	return nil
}

func (t *suiteTarget) Read(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return "", err
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New("GET " + t.url + ": " + resp.Status)
	}
	return string(b), err
}

func (t *suiteTarget) Close() error { t.tr.CloseIdleConnections(); return nil }

func openSuiteTarget(ifMatch bool) conformance.GuardOpener {
	return func(_ context.Context, base, resource string) (conformance.GuardTarget, error) {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		return &suiteTarget{client: &http.Client{Transport: tr}, tr: tr,
			url: base + "/v/" + url.PathEscape(resource), ifMatch: ifMatch}, nil
	}
}

func runSuite(t *testing.T, guard string) {
	srv := httptest.NewServer(newValueService(&httpfence.Fence{}))
	defer srv.Close()
	r := testenv.StartRedis(t)
	conformance.RunGuardSuite(t, conformance.GuardConfig{
		Guard: guard, Server: "net/http service", Config: srv.URL, LockDSN: r.URL(),
		NotDurable: "the test's HTTP service keeps its values and the Fence its tokens in memory",
		// The handler reads a 256 KiB body inside the guarded section: a
		// Fence that let it run outside would fail Atomic.
		ValueSize: 256 << 10,
	})
}

func TestGuardSuiteHeader(t *testing.T)  { runSuite(t, "http-header") }
func TestGuardSuiteIfMatch(t *testing.T) { runSuite(t, "http-if-match") }
