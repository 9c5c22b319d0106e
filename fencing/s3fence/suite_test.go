package s3fence_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/fencing/s3fence"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/redis" // the paused-holder case's lock service
)

// suiteTarget is a conformance.GuardTarget: one object written through a
// Guard.
type suiteTarget struct {
	g   *s3fence.Guard
	tr  *http.Transport
	key string
}

func (t *suiteTarget) Write(ctx context.Context, token dlock.Token, value string) error {
	return t.g.Put(ctx, t.key, token, strings.NewReader(value))
}

func (t *suiteTarget) Read(ctx context.Context) (string, error) {
	r, _, err := t.g.Get(ctx, t.key)
	if errors.Is(err, s3fence.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	return string(b), err
}

func (t *suiteTarget) Close() error { t.tr.CloseIdleConnections(); return nil }

// openSuiteTarget opens a target on the S3 server at endpoint (http://host:port).
func openSuiteTarget(_ context.Context, endpoint, resource string) (conformance.GuardTarget, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &suiteTarget{g: &s3fence.Guard{Client: newClient(endpoint, tr), Bucket: bucket}, tr: tr, key: resource}, nil
}

// newClient returns a path-style S3 client of endpoint with throw-away
// credentials.
func newClient(endpoint string, tr http.RoundTripper) *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		UsePathStyle: true,
		HTTPClient:   &http.Client{Transport: tr},
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
}

// TestGuardSuite runs the guard suite on a fakes3 that keeps its objects in a
// bbolt file, so that they survive a crash (SIGKILL) and a restart.
func TestGuardSuite(t *testing.T) {
	srv := startS3(t, filepath.Join(t.TempDir(), "s3.db"))
	r := testenv.StartRedis(t)
	conformance.RunGuardSuite(t, conformance.GuardConfig{
		Guard: "s3", Server: "gofakes3 (bbolt)", Config: "http://" + srv.addr, LockDSN: r.URL(),
		Restart: func(t testing.TB) {
			srv.Kill()
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
		},
	})
}
