package s3fence_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/s3fence"
)

// TestServerRefusesStaleConditionalWrite proves that the server the guard's
// tests use enforces conditional writes by itself: a PutObject whose
// If-Match names an ETag the object no longer has, or whose If-None-Match: *
// meets an existing object, is refused with 412 by the server, with no dlock
// code involved.
func TestServerRefusesStaleConditionalWrite(t *testing.T) {
	ctx := context.Background()
	c := startS3(t, "").client(t)
	put := func(body, ifMatch, ifNoneMatch string) (*s3.PutObjectOutput, error) {
		in := &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("k"), Body: strings.NewReader(body)}
		if ifMatch != "" {
			in.IfMatch = aws.String(ifMatch)
		}
		if ifNoneMatch != "" {
			in.IfNoneMatch = aws.String(ifNoneMatch)
		}
		return c.PutObject(ctx, in)
	}
	refused := func(what string, err error) {
		t.Helper()
		var re *smithyhttp.ResponseError
		var ae smithy.APIError
		if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusPreconditionFailed || !errors.As(err, &ae) || ae.ErrorCode() != "PreconditionFailed" {
			t.Fatalf("%s: %v; want the server's 412 PreconditionFailed", what, err)
		}
	}

	first, err := put("v1", "", "*")
	if err != nil {
		t.Fatalf("create with If-None-Match: *: %v", err)
	}
	_, err = put("v1bis", "", "*")
	refused("If-None-Match: * on an existing object", err)
	second, err := put("v2", *first.ETag, "")
	if err != nil {
		t.Fatalf("If-Match with the current ETag: %v", err)
	}
	if *second.ETag == *first.ETag {
		t.Fatalf("the ETag did not change: %s", *second.ETag)
	}
	_, err = put("v3", *first.ETag, "")
	refused("If-Match with a stale ETag", err)
	_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("absent"),
		Body: strings.NewReader("x"), IfMatch: first.ETag})
	refused("If-Match on a missing object", err)

	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Body.Close()
	if b, _ := io.ReadAll(out.Body); string(b) != "v2" {
		t.Fatalf("the object holds %q after the refused writes; want v2", b)
	}
}

func newGuard(t *testing.T, srv *s3Server) *s3fence.Guard {
	return &s3fence.Guard{Client: srv.client(t), Bucket: bucket}
}

// get reads key through the guard.
func get(t *testing.T, g *s3fence.Guard, key string) (string, dlock.Token) {
	t.Helper()
	r, tok, err := g.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), tok
}

func wantStale(t *testing.T, err error, token, highest dlock.Token) {
	t.Helper()
	var se *fencing.StaleTokenError
	if !errors.Is(err, fencing.ErrStaleToken) || !errors.As(err, &se) || se.Token != token || se.Highest != highest {
		t.Fatalf("%v; want a stale token error for %d below %d", err, token, highest)
	}
}

func TestGuardRejectsStaleToken(t *testing.T) {
	ctx := context.Background()
	srv := startS3(t, "")
	var rejected int
	g := newGuard(t, srv)
	g.OnReject = func(*fencing.StaleTokenError) { rejected++ }
	for _, n := range []dlock.Token{5, 5, 7} {
		if err := g.Put(ctx, "a", n, strings.NewReader(fmt.Sprint("by ", n))); err != nil {
			t.Fatalf("token %d: %v", n, err)
		}
	}
	wantStale(t, g.Put(ctx, "a", 6, strings.NewReader("by 6")), 6, 7)
	wantStale(t, g.Put(ctx, "a", 0, strings.NewReader("by 0")), 0, 7)
	wantStale(t, g.Delete(ctx, "a", 6), 6, 7)
	if body, tok := get(t, g, "a"); body != "by 7" || tok != 7 {
		t.Fatalf("a holds %q by %d; want \"by 7\" by 7: a refused write changed it", body, tok)
	}
	if rejected != 3 {
		t.Fatalf("OnReject saw %d rejections, want 3", rejected)
	}
	// The body is read from its offset.
	r := strings.NewReader("skip:kept")
	_, _ = r.Seek(5, io.SeekStart)
	if err := g.Put(ctx, "b", 1, r); err != nil {
		t.Fatal(err)
	}
	if body, _ := get(t, g, "b"); body != "kept" {
		t.Fatalf("b holds %q; want kept", body)
	}
	// Other readers see the header line, then the bytes.
	out, err := srv.client(t).GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("b")})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Body.Close()
	raw, _ := io.ReadAll(out.Body)
	if line, rest, _ := strings.Cut(string(raw), "\n"); line != "dlock-fence 1" || rest != "kept" || out.Metadata[s3fence.FenceMetadata] != "1" {
		t.Fatalf("raw object %q, metadata %v", raw, out.Metadata)
	}
}

// TestGuardSameBytesAgain: a stale writer reads the object, a newer token
// writes the very same bytes (an ETag is the MD5 of the bytes), and the stale
// writer's conditional put must still be refused.
func TestGuardSameBytesAgain(t *testing.T) {
	ctx := context.Background()
	srv := startS3(t, "")
	g := newGuard(t, srv)
	if err := g.Put(ctx, "k", 3, strings.NewReader("same")); err != nil {
		t.Fatal(err)
	}
	once := false
	restore := s3fence.SetHookBeforePut(func(key string, token dlock.Token) {
		if token != 4 || once {
			return
		}
		once = true
		// Token 4 compared against 3 and is about to put: token 5 writes
		// the same bytes first.
		if err := g.Put(ctx, "k", 5, strings.NewReader("same")); err != nil {
			t.Errorf("token 5: %v", err)
		}
	})
	defer restore()
	wantStale(t, g.Put(ctx, "k", 4, strings.NewReader("stale")), 4, 5)
	if body, tok := get(t, g, "k"); body != "same" || tok != 5 {
		t.Fatalf("k holds %q by %d; want \"same\" by 5", body, tok)
	}
}

// TestGuardLosesToHigherTokenMidWrite: a higher token writes between a
// stale writer's compare and its put; the server refuses the put, and the
// guard, comparing again, refuses the stale token.
func TestGuardLosesToHigherTokenMidWrite(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, startS3(t, ""))
	once := false
	restore := s3fence.SetHookBeforePut(func(key string, token dlock.Token) {
		if token != 4 || once {
			return
		}
		once = true
		if err := g.Put(ctx, key, 5, strings.NewReader("by 5")); err != nil {
			t.Errorf("token 5: %v", err)
		}
	})
	defer restore()
	for _, key := range []string{"new", "old"} {
		once = false
		if key == "old" {
			if err := g.Put(ctx, key, 3, strings.NewReader("by 3")); err != nil {
				t.Fatal(err)
			}
		}
		wantStale(t, g.Put(ctx, key, 4, strings.NewReader("by 4")), 4, 5)
		if body, tok := get(t, g, key); body != "by 5" || tok != 5 {
			t.Fatalf("%s holds %q by %d; want \"by 5\" by 5", key, body, tok)
		}
	}
}

// TestGuardRetriesWhileCurrent: a write that loses the race to an equal or
// lower token compares again and goes through, since its token is still
// the highest.
func TestGuardRetriesWhileCurrent(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, startS3(t, ""))
	once := false
	restore := s3fence.SetHookBeforePut(func(key string, token dlock.Token) {
		if token != 9 || once {
			return
		}
		once = true
		if err := g.Put(ctx, "k", 8, strings.NewReader("by 8")); err != nil {
			t.Errorf("token 8: %v", err)
		}
	})
	defer restore()
	if err := g.Put(ctx, "k", 9, strings.NewReader("by 9")); err != nil {
		t.Fatal(err)
	}
	if body, tok := get(t, g, "k"); body != "by 9" || tok != 9 {
		t.Fatalf("k holds %q by %d; want \"by 9\" by 9", body, tok)
	}
}

func TestGuardDeleteKeepsTheFence(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, startS3(t, ""))
	if err := g.Put(ctx, "k", 5, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if err := g.Delete(ctx, "k", 6); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Get(ctx, "k"); !errors.Is(err, s3fence.ErrNotFound) {
		t.Fatalf("Get after Delete: %v; want ErrNotFound", err)
	}
	if _, _, err := g.Get(ctx, "never"); !errors.Is(err, s3fence.ErrNotFound) {
		t.Fatalf("Get of a missing object: %v; want ErrNotFound", err)
	}
	wantStale(t, g.Put(ctx, "k", 5, strings.NewReader("again")), 5, 6)
	if err := g.Put(ctx, "k", 7, strings.NewReader("y")); err != nil {
		t.Fatal(err)
	}
	if body, tok := get(t, g, "k"); body != "y" || tok != 7 {
		t.Fatalf("k holds %q by %d", body, tok)
	}
}

// TestGuardConcurrentWriters: 8 writers with random tokens; in the end the
// object holds a write of the highest token accepted, and every refusal
// named a higher token.
func TestGuardConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, startS3(t, ""))
	var mu sync.Mutex
	var maxAccepted dlock.Token
	bodies := map[string]dlock.Token{}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 15; i++ {
				tok := dlock.Token(1 + rand.IntN(40))
				body := fmt.Sprintf("w%d-%d", w, i)
				err := g.Put(ctx, "k", tok, bytes.NewReader([]byte(body)))
				var se *fencing.StaleTokenError
				switch {
				case err == nil:
					mu.Lock()
					maxAccepted = max(maxAccepted, tok)
					bodies[body] = tok
					mu.Unlock()
				case errors.As(err, &se):
					if se.Highest <= tok {
						t.Errorf("token %d refused below %d", tok, se.Highest)
					}
				default:
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	body, tok := get(t, g, "k")
	if tok != maxAccepted || bodies[body] != maxAccepted {
		t.Fatalf("k holds %q by %d; want a write of the highest accepted token %d", body, tok, maxAccepted)
	}
}

// TestGuardFenceSurvivesRestart: the token lives in the object, which the
// server keeps on disk; after a restart a stale token is still refused.
func TestGuardFenceSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	srv := startS3(t, filepath.Join(t.TempDir(), "s3.db"))
	g := newGuard(t, srv)
	if err := g.Put(ctx, "k", 5, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	wantStale(t, g.Put(ctx, "k", 4, strings.NewReader("stale")), 4, 5)
	if body, tok := get(t, g, "k"); body != "x" || tok != 5 {
		t.Fatalf("k holds %q by %d after the restart", body, tok)
	}
}

func TestGuardRequiresClientAndBucket(t *testing.T) {
	var g s3fence.Guard
	if err := g.Put(context.Background(), "k", 1, strings.NewReader("")); err == nil {
		t.Fatal("a Guard without Client and Bucket wrote")
	}
}

// wrongETag is a Client that sends every conditional put with an ETag the
// object does not have, so that the server refuses each one.
type wrongETag struct{ s3fence.Client }

func (c wrongETag) PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	if in.IfMatch != nil {
		in.IfMatch = aws.String(`"00000000000000000000000000000000"`)
	}
	return c.Client.PutObject(ctx, in, opts...)
}

// TestGuardGivesUpOnAServerThatKeepsRefusing: a server that refuses every
// put on the ETag it reported makes Put fail, not spin.
func TestGuardGivesUpOnAServerThatKeepsRefusing(t *testing.T) {
	ctx := context.Background()
	srv := startS3(t, "")
	g := newGuard(t, srv)
	if err := g.Put(ctx, "k", 1, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	bad := &s3fence.Guard{Client: wrongETag{g.Client}, Bucket: bucket}
	err := bad.Put(ctx, "k", 2, strings.NewReader("y"))
	if err == nil || errors.Is(err, fencing.ErrStaleToken) || !strings.Contains(err.Error(), "refused 3 conditional writes") {
		t.Fatalf("Put through a client whose condition never holds: %v; want the guard to give up", err)
	}
	if body, tok := get(t, g, "k"); body != "x" || tok != 1 {
		t.Fatalf("k holds %q by %d; want it unchanged", body, tok)
	}
}

// dropsFirstPut is a Client whose first put is answered with success and the
// object's current ETag without reaching the server: a server that
// acknowledges a put it does not store.
type dropsFirstPut struct {
	s3fence.Client
	dropped *bool
}

func (c dropsFirstPut) PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	if !*c.dropped {
		*c.dropped = true
		return &s3.PutObjectOutput{ETag: in.IfMatch}, nil
	}
	return c.Client.PutObject(ctx, in, opts...)
}

// TestGuardNoticesAPutNotStored: a put acknowledged with an ETag that is
// not the MD5 of the bytes sent is not taken for a write; the guard looks,
// compares again and writes, so that Put's nil means the object holds it.
func TestGuardNoticesAPutNotStored(t *testing.T) {
	ctx := context.Background()
	srv := startS3(t, "")
	g := newGuard(t, srv)
	if err := g.Put(ctx, "k", 3, strings.NewReader("by 3")); err != nil {
		t.Fatal(err)
	}
	var dropped bool
	odd := &s3fence.Guard{Client: dropsFirstPut{g.Client, &dropped}, Bucket: bucket}
	if err := odd.Put(ctx, "k", 4, strings.NewReader("by 4")); err != nil {
		t.Fatalf("Put with token 4 after a put the server did not store: %v", err)
	}
	if !dropped {
		t.Fatal("the client dropped no put")
	}
	if body, tok := get(t, g, "k"); body != "by 4" || tok != 4 {
		t.Fatalf("k holds %q by %d after Put returned nil; want \"by 4\" by 4", body, tok)
	}
}
