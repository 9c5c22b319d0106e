package s3fence_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
)

// bucket is the bucket fakes3 creates at start.
const bucket = "dlock"

var (
	binDir    string // the test binary's temporary directory for fakes3
	buildOnce sync.Once
	buildErr  error
)

func TestMain(m *testing.M) {
	conformance.RegisterGuard("s3", openSuiteTarget)
	conformance.Main(m) // the paused-holder case's child process runs here
	dir, err := os.MkdirTemp("", "s3fence-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fakes3Binary builds the S3 server of internal/fakes3 (gofakes3) once per
// test binary and returns its path.
func fakes3Binary(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(binDir, "fakes3")
	buildOnce.Do(func() {
		cmd := exec.Command("go", "build", "-o", bin, "./internal/fakes3")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building internal/fakes3: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// s3Server is an S3 server the test started as a child process.
type s3Server struct {
	*testenv.Process
	addr string
}

// startS3 starts fakes3 on a free loopback port; with db non-empty it keeps
// the objects in that file, so that they survive a restart.
func startS3(t testing.TB, db string) *s3Server {
	t.Helper()
	port := testenv.FreePort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{"-addr", addr, "-bucket", bucket}
	if db != "" {
		args = append(args, "-db", db)
	}
	p := testenv.NewProcess(t, testenv.ProcessConfig{
		Name:  "fakes3",
		Path:  fakes3Binary(t),
		Args:  args,
		Ports: []int{port},
		Ready: func(ctx context.Context, pid int) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			return resp.Body.Close()
		},
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	return &s3Server{Process: p, addr: addr}
}

// client returns an S3 client of the server (see newClient).
func (s *s3Server) client(t testing.TB) *s3.Client {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return newClient("http://"+s.addr, tr)
}
