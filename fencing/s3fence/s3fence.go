// Package s3fence fences writes to S3-compatible object storage by dlock's
// fencing tokens: Guard.Put and Guard.Delete refuse a token older than the
// newest that wrote the object, and the compare is made by the storage
// server itself, through a conditional write.
//
// # The atomic step
//
// Each object keeps the highest token that wrote it in its metadata
// (x-amz-meta-dlock-fence). A write reads the object's ETag and token
// (HeadObject), refuses a lower token, and writes with If-Match on that ETag
// (If-None-Match: * if there was no object): the server stores the write
// only if the object is still the one whose token was compared. If another
// write came first, the server answers 412 and the guard reads and compares
// again, writing only while its token is still the highest.
//
// An ETag is usually the MD5 of the object's bytes, so two writes of the same
// bytes have the same ETag, and a stale writer's If-Match could match a newer
// object that happens to hold the bytes it read. The guard therefore stores
// each object behind a one-line header that names the token,
//
//	dlock-fence <token>\n
//
// so that once a higher token has written, the bytes a stale writer read can
// never be stored again. Guard.Get strips the header; other readers skip the
// first line. Delete writes a tombstone (an object with the header alone and
// the metadata x-amz-meta-dlock-deleted: true), because an object that is gone
// would forget its token and let a stale writer create it again.
package s3fence

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// The object metadata the guard keeps (the names after x-amz-meta-).
const (
	// FenceMetadata holds the highest token that wrote the object.
	FenceMetadata = "dlock-fence"
	// DeletedMetadata is "true" on a tombstone that Delete wrote, "false" on
	// an object Put wrote.
	DeletedMetadata = "dlock-deleted"
)

// ErrNotFound is matched (errors.Is) by Get's error for an object that does
// not exist or that Delete removed.
var ErrNotFound = errors.New("s3fence: no such object")

// Client is the part of the S3 API the guard uses; *s3.Client has it.
type Client interface {
	HeadObject(ctx context.Context, in *s3.HeadObjectInput, opts ...func(*s3.Options)) (*s3.HeadObjectOutput, error)
	GetObject(ctx context.Context, in *s3.GetObjectInput, opts ...func(*s3.Options)) (*s3.GetObjectOutput, error)
	PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error)
}

// Guard makes fenced writes to one bucket. It holds no state of its own and
// is safe for concurrent use; Client and Bucket are required. The server must
// honour If-Match and If-None-Match on PutObject (AWS S3 does since 2024; a
// server that ignores them lets stale writes through).
type Guard struct {
	// Client sends the requests. Required.
	Client Client
	// Bucket holds the objects. Required.
	Bucket string
	// OnReject, if set, is called with every rejection of a stale token. It
	// must not block.
	OnReject func(*fencing.StaleTokenError)
}

// maxSameRefusals is how many puts in a row the server may refuse on the
// ETag that head sent before the guard gives up.
const maxSameRefusals = 3

// testHookBeforePut, if set by a test, runs between a write's read of the
// object and its conditional put.
var testHookBeforePut func(key string, token dlock.Token)

// Put writes body to key if token is at least the highest token that wrote
// key, recording token as the highest. A lower token, and token 0, are
// refused with a *fencing.StaleTokenError (it matches fencing.ErrStaleToken).
// body is read from its current offset, and again from there if the write
// must be retried.
func (g *Guard) Put(ctx context.Context, key string, token dlock.Token, body io.ReadSeeker) error {
	if err := g.write(ctx, key, token, body, false); err != nil {
		return fmt.Errorf("s3fence: put %q: %w", key, err)
	}
	return nil
}

// Delete removes key if token is at least the highest token that wrote it,
// by writing a tombstone that keeps token (see the package doc); Get then
// reports ErrNotFound. Refusals are as for Put.
func (g *Guard) Delete(ctx context.Context, key string, token dlock.Token) error {
	if err := g.write(ctx, key, token, nil, true); err != nil {
		return fmt.Errorf("s3fence: delete %q: %w", key, err)
	}
	return nil
}

// Get returns the bytes of key as Put wrote them, and the token that wrote
// them; the caller closes the reader. An object written without the guard is
// returned whole, with token 0. A missing or deleted object gives an error
// matching ErrNotFound.
func (g *Guard) Get(ctx context.Context, key string) (io.ReadCloser, dlock.Token, error) {
	out, err := g.Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(g.Bucket), Key: aws.String(key)})
	if err != nil {
		if isNotFound(err) {
			err = ErrNotFound
		}
		return nil, 0, fmt.Errorf("s3fence: get %q: %w", key, err)
	}
	fence, ok, err := parseFence(out.Metadata)
	if err != nil {
		out.Body.Close()
		return nil, 0, fmt.Errorf("s3fence: get %q: %w", key, err)
	}
	if !ok {
		return out.Body, 0, nil
	}
	if out.Metadata[DeletedMetadata] == "true" {
		out.Body.Close()
		return nil, 0, fmt.Errorf("s3fence: get %q: %w", key, ErrNotFound)
	}
	if err := skipHeader(out.Body); err != nil {
		out.Body.Close()
		return nil, 0, fmt.Errorf("s3fence: get %q: %w", key, err)
	}
	return out.Body, fence, nil
}

// write is Put (body non-nil) and Delete (deleted): read, compare, and put
// on the condition that the object is unchanged, until the put succeeds or
// a higher token is found.
func (g *Guard) write(ctx context.Context, key string, token dlock.Token, body io.ReadSeeker, deleted bool) error {
	if g.Client == nil || g.Bucket == "" {
		return errors.New("Guard.Client and Guard.Bucket are required")
	}
	var start int64
	if body != nil {
		var err error
		if start, err = body.Seek(0, io.SeekCurrent); err != nil {
			return fmt.Errorf("reading the body's offset: %w", err)
		}
	}
	refused, same := "", 0 // the ETag of the last refused put, and how many times in a row
	for {
		etag, fence, err := g.head(ctx, key)
		if err != nil {
			return err
		}
		if token == 0 || token < fence {
			e := &fencing.StaleTokenError{Resource: g.Bucket + "/" + key, Token: token, Highest: fence}
			if g.OnReject != nil {
				g.OnReject(e)
			}
			return e
		}
		if testHookBeforePut != nil {
			testHookBeforePut(key, token)
		}
		header := fmt.Appendf(nil, "dlock-fence %d\n", token)
		in := &s3.PutObjectInput{
			Bucket: aws.String(g.Bucket),
			Key:    aws.String(key),
			Metadata: map[string]string{
				FenceMetadata:   strconv.FormatUint(uint64(token), 10),
				DeletedMetadata: strconv.FormatBool(deleted),
			},
		}
		if etag == "" {
			in.IfNoneMatch = aws.String("*")
		} else {
			in.IfMatch = aws.String(etag)
		}
		size := int64(len(header))
		sum := md5.New() // the ETag a server that stores these bytes answers
		sum.Write(header)
		if deleted {
			in.Body = &concat{head: header}
		} else {
			if _, err := body.Seek(start, io.SeekStart); err != nil {
				return fmt.Errorf("rewinding the body: %w", err)
			}
			n, err := io.Copy(sum, body)
			if err != nil {
				return fmt.Errorf("reading the body: %w", err)
			}
			if _, err := body.Seek(start, io.SeekStart); err != nil {
				return fmt.Errorf("rewinding the body: %w", err)
			}
			size += n
			in.Body = &concat{head: header, tail: body, tailStart: start}
		}
		in.ContentLength = aws.Int64(size)
		out, err := g.Client.PutObject(ctx, in)
		if err == nil && out.ETag != nil && strings.Trim(*out.ETag, `"`) != hex.EncodeToString(sum.Sum(nil)) {
			// Not the MD5 of these bytes: an encrypted object's ETag, or a
			// server that acknowledged a put it did not store. Look.
			if _, f, herr := g.head(ctx, key); herr != nil || f != token {
				err = errNotStored // compare again, as after a refusal
			}
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errNotStored):
			if same++; same >= maxSameRefusals {
				return fmt.Errorf("the server answered %d puts without storing them: %w", same, err)
			}
			continue
		case isConditionFailed(err):
			// The object changed since head: compare again. A server that
			// keeps refusing the ETag that head keeps sending does not
			// compare ETags as it sends them: give up rather than spin.
			if etag == refused {
				same++
			} else {
				refused, same = etag, 1
			}
			if same >= maxSameRefusals {
				return fmt.Errorf("the server refused %d conditional writes in a row on the object's current ETag %s: %w", same, etag, err)
			}
			continue
		default:
			return err
		}
	}
}

// errNotStored means a put was answered with success and an ETag that is not
// the MD5 of the bytes sent: the server kept another object.
var errNotStored = errors.New("the server did not store the object it acknowledged")

// head returns key's ETag ("" if there is no object) and the token that
// wrote it (0 if none).
func (g *Guard) head(ctx context.Context, key string) (etag string, fence dlock.Token, err error) {
	out, err := g.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(g.Bucket), Key: aws.String(key)})
	if err != nil {
		if isNotFound(err) {
			return "", 0, nil
		}
		return "", 0, err
	}
	if out.ETag == nil || *out.ETag == "" {
		return "", 0, errors.New("the server sent no ETag for the object")
	}
	fence, _, err = parseFence(out.Metadata)
	return *out.ETag, fence, err
}

func parseFence(meta map[string]string) (dlock.Token, bool, error) {
	v, ok := meta[FenceMetadata]
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("the object's %s metadata is not a token", FenceMetadata)
	}
	return dlock.Token(n), true, nil
}

// maxHeader bounds the header line Get skips.
const maxHeader = 128

// skipHeader reads r up to and including the first newline.
func skipHeader(r io.Reader) error {
	var b [1]byte
	for i := 0; i < maxHeader; i++ {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return fmt.Errorf("reading the object's fence header: %w", err)
		}
		if b[0] == '\n' {
			return nil
		}
	}
	return errors.New("the object's fence header is too long")
}

func isNotFound(err error) bool {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
		return true
	}
	var ae smithy.APIError
	return errors.As(err, &ae) && (ae.ErrorCode() == "NotFound" || ae.ErrorCode() == "NoSuchKey")
}

// isConditionFailed reports whether the server refused a put because the
// object no longer matched its condition (412), or because another
// conditional write to it was in flight (409 ConditionalRequestConflict).
func isConditionFailed(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) && (ae.ErrorCode() == "PreconditionFailed" || ae.ErrorCode() == "ConditionalRequestConflict") {
		return true
	}
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusPreconditionFailed
}

// concat is the header followed by the body from tailStart, as an
// io.ReadSeeker, so that the SDK can sign it and send it again.
type concat struct {
	head      []byte
	tail      io.ReadSeeker // nil for a tombstone
	tailStart int64
	off       int64
}

func (c *concat) Read(p []byte) (int, error) {
	if c.off < int64(len(c.head)) {
		n := copy(p, c.head[c.off:])
		c.off += int64(n)
		return n, nil
	}
	if c.tail == nil {
		return 0, io.EOF
	}
	n, err := c.tail.Read(p)
	c.off += int64(n)
	return n, err
}

func (c *concat) Seek(offset int64, whence int) (int64, error) {
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = c.off + offset
	case io.SeekEnd:
		size := int64(len(c.head))
		if c.tail != nil {
			end, err := c.tail.Seek(0, io.SeekEnd)
			if err != nil {
				return 0, err
			}
			size += end - c.tailStart
		}
		abs = size + offset
	default:
		return 0, errors.New("s3fence: invalid whence")
	}
	if abs < 0 {
		return 0, errors.New("s3fence: negative position")
	}
	if c.tail != nil {
		t := abs - int64(len(c.head))
		if t < 0 {
			t = 0
		}
		if _, err := c.tail.Seek(c.tailStart+t, io.SeekStart); err != nil {
			return 0, err
		}
	}
	c.off = abs
	return abs, nil
}
