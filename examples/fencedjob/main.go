//go:build unix

// Command fencedjob shows fencing at two resources at once: a job that writes
// a report to object storage (S3, through package s3fence) and publishes it
// to an HTTP service (through package httpfence), and a paused copy of the
// job that both refuse.
//
// The program serves an S3 server (gofakes3, which enforces conditional
// writes) and an HTTP service fenced by httpfence.Fence on loopback, and
// starts job A in a process of its own (itself, re-executed). Job A takes the
// lock, writes the report and publishes it, and is then frozen (SIGSTOP) for
// longer than its lease's TTL — a GC pause, a frozen VM — while it has a
// second write in flight. Job B, in this process, gets the lock once A's
// lease has expired, with a higher token, and writes and publishes. Then the
// program thaws A: its late write and call go out with its old token, and
// the bucket and the service both refuse them. The program prints the
// timeline and exits 0 if the report and the published copy are B's.
//
// The lock is on an etcd server the program starts in-process (nothing to
// install); -dsn takes any backend that both processes reach.
//
//	cd examples && go run ./fencedjob
//	cd examples && go run ./fencedjob -dsn redis://127.0.0.1:6379/0
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/dlock-go/dlock"
	_ "github.com/dlock-go/dlock/etcd" // registers etcd://
	"github.com/dlock-go/dlock/examples/internal/embedetcd"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/httpfence"
	"github.com/dlock-go/dlock/fencing/s3fence"
	_ "github.com/dlock-go/dlock/redis"     // registers redis://
	_ "github.com/dlock-go/dlock/zookeeper" // registers zk://
)

// Job A's process learns its part from the environment.
const (
	envDSN     = "DLOCK_FENCEDJOB_DSN"
	envS3      = "DLOCK_FENCEDJOB_S3"
	envService = "DLOCK_FENCEDJOB_SERVICE"
	envTTL     = "DLOCK_FENCEDJOB_TTL"
)

const (
	lockKey   = "jobs/nightly-report"
	bucket    = "reports"
	objectKey = "nightly/report.txt"
)

func main() {
	if os.Getenv(envDSN) != "" {
		if err := jobA(); err != nil {
			fmt.Fprintln(os.Stderr, "job A:", err)
			os.Exit(1)
		}
		return
	}
	dsn := flag.String("dsn", "", "lock backend both jobs reach (etcd://host:2379/prefix, redis://host:port/db, zk://…); default: an embedded etcd server")
	ttl := flag.Duration("ttl", 2*time.Second, "the lease's TTL; job A is frozen for 2× this")
	flag.Parse()
	if err := run(os.Args[0], *dsn, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "fencedjob:", err)
		os.Exit(1)
	}
}

// service is the HTTP service the jobs publish to: PUT /published stores the
// body, fenced by httpfence (the handler runs inside the Fence's guarded
// section); GET returns it.
type service struct {
	mu        sync.Mutex
	published string
}

func (s *service) handler() http.Handler {
	fence := &httpfence.Fence{}
	put := fence.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.published = string(b)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			put.ServeHTTP(w, r)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		_, _ = io.WriteString(w, s.published)
	})
}

// serve serves h on a free loopback port until the returned stop is called.
func serve(h http.Handler) (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }() // owned by stop
	return ln.Addr().String(), func() { _ = hs.Close(); <-served }, nil
}

func run(self, dsn string, ttl time.Duration) error {
	start := time.Now()
	say := func(who, format string, args ...any) {
		fmt.Printf("%+7.3fs  %-5s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}
	ctx := context.Background()
	if dsn == "" {
		srv, err := embedetcd.Start("fencedjob")
		if err != nil {
			return fmt.Errorf("embedded etcd: %w", err)
		}
		defer srv.Close()
		dsn = srv.DSN("/fencedjob-example")
		say("setup", "the lock is on an embedded etcd server on %s (-dsn picks another backend)", srv.Addr)
	}

	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		return err
	}
	s3Addr, stopS3, err := serve(gofakes3.New(backend).Server())
	if err != nil {
		return err
	}
	defer stopS3()
	s3URL := "http://" + s3Addr
	say("setup", "an S3 server (gofakes3) on %s, bucket %q", s3URL, bucket)

	svc := &service{}
	svcAddr, stopSvc, err := serve(svc.handler())
	if err != nil {
		return err
	}
	defer stopSvc()
	svcURL := "http://" + svcAddr + "/published"
	say("setup", "the HTTP service, fenced by httpfence, at %s", svcURL)

	a, err := startJobA(self, dsn, s3URL, svcURL, ttl)
	if err != nil {
		return err
	}
	defer a.stop()
	timeout := 30*time.Second + 10*ttl
	for _, want := range []string{"granted", "S3 write accepted", "publish accepted"} {
		line, err := a.expect(want, timeout)
		if err != nil {
			return err
		}
		say("A", "%s", line)
	}
	if _, err := a.expect("ready", timeout); err != nil {
		return err
	}
	freeze := 2 * ttl
	say("A", "process frozen (SIGSTOP) for %v, past its TTL of %v, with its next write in flight", freeze, ttl)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	frozenAt := time.Now()
	if err := a.send("go"); err != nil { // read once A thaws
		return err
	}

	// Job B, here: it gets the lock once A's lease has expired.
	locker, err := dlock.Open(ctx, dsn)
	if err != nil {
		return err
	}
	defer locker.Close()
	s3c, closeS3c := s3Client(s3URL)
	defer closeS3c()
	objects := &s3fence.Guard{Client: s3c, Bucket: bucket}
	publisher, closePub := publishClient()
	defer closePub()
	err = dlock.Do(ctx, locker, lockKey, func(ctx context.Context, lease *dlock.Lease) error {
		say("B", "granted the lock with token %v, %v after A was frozen", lease.Token(), time.Since(frozenAt).Round(time.Millisecond))
		if err := objects.Put(ctx, objectKey, lease.Token(), strings.NewReader("report by B")); err != nil {
			return err
		}
		say("B", "S3 write accepted")
		if err := publish(ctx, publisher, svcURL, "report by B"); err != nil {
			return err
		}
		say("B", "publish accepted")
		return nil
	}, dlock.WithTTL(ttl))
	if err != nil {
		return fmt.Errorf("job B: %w", err)
	}

	if rest := freeze - time.Since(frozenAt); rest > 0 {
		time.Sleep(rest)
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	say("A", "thawed (SIGCONT): its write and its call go out with its old token")
	for _, want := range []string{"S3 write REJECTED", "publish REJECTED"} {
		line, err := a.expect(want, timeout)
		if err != nil {
			return fmt.Errorf("job A's late write was not refused: %w", err)
		}
		say("A", "%s", line)
	}

	r, tok, err := objects.Get(ctx, objectKey)
	if err != nil {
		return err
	}
	report, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		return err
	}
	svc.mu.Lock()
	published := svc.published
	svc.mu.Unlock()
	say("done", "the bucket holds %q (token %v); the service published %q", report, tok, published)
	if string(report) != "report by B" || published != "report by B" {
		return errors.New("invariant broken: job A's late write landed")
	}
	return nil
}

// s3Client returns a path-style S3 client of endpoint (gofakes3 accepts any
// credentials), and a func that closes its idle connections.
func s3Client(endpoint string) (*s3.Client, func()) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		UsePathStyle: true,
		HTTPClient:   &http.Client{Transport: tr},
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "example", SecretAccessKey: "example"}, nil
		}),
	}), tr.CloseIdleConnections
}

// publishClient returns an HTTP client that sends each request's lease token
// (httpfence.Transport), and a func that closes its idle connections.
func publishClient() (*http.Client, func()) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &http.Client{Transport: &httpfence.Transport{Base: tr}, Timeout: 5 * time.Second}, tr.CloseIdleConnections
}

// publish PUTs report to the service, under the lease that ctx carries. A
// refusal of a stale token is a *fencing.StaleTokenError.
func publish(ctx context.Context, c *http.Client, url, report string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(report))
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := httpfence.CheckResponse(resp); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("publish: %s", resp.Status)
	}
	return nil
}

// jobA is job A's process: it takes the lock, writes the report and
// publishes it, says "ready", and once told "go" (the program freezes it
// between the two) writes and publishes again with the same lease, as a job
// whose write was in flight when it froze: it does not look at the lease
// before writing, and its ctx (ContextWithLease) is not cancelled when the
// lease ends. It reports each outcome on its standard output.
func jobA() error {
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	ctx := context.Background()
	locker, err := dlock.Open(ctx, os.Getenv(envDSN))
	if err != nil {
		return err
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, lockKey, dlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer lease.Release(ctx)
	fmt.Printf("granted the lock with token %v\n", lease.Token())
	s3c, closeS3c := s3Client(os.Getenv(envS3))
	defer closeS3c()
	objects := &s3fence.Guard{Client: s3c, Bucket: bucket}
	publisher, closePub := publishClient()
	defer closePub()
	url := os.Getenv(envService)
	wctx := dlock.ContextWithLease(ctx, lease)

	write := func(report string) {
		err := objects.Put(wctx, objectKey, lease.Token(), strings.NewReader(report))
		fmt.Println(outcome("S3 write", lease.Token(), err))
		if err == nil { // what the bucket now holds, for a reader of a failure
			if r, tok, gerr := objects.Get(wctx, objectKey); gerr == nil {
				b, _ := io.ReadAll(r)
				r.Close()
				fmt.Printf("S3 object now: %q, token %v\n", b, tok)
			}
		}
		err = publish(wctx, publisher, url, report)
		fmt.Println(outcome("publish", lease.Token(), err))
	}
	write("report by A")
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil { // "go"
		return err
	}
	write("report by A, late")
	return nil
}

func outcome(what string, token dlock.Token, err error) string {
	var stale *fencing.StaleTokenError
	switch {
	case err == nil:
		return fmt.Sprintf("%s accepted (token %v)", what, token)
	case errors.As(err, &stale):
		return fmt.Sprintf("%s REJECTED: token %v is stale, %v was accepted since", what, stale.Token, stale.Highest)
	default:
		return fmt.Sprintf("%s failed: %v", what, err)
	}
}

// proc is job A's running process and the lines it prints.
type proc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	done  chan struct{}
}

// startJobA re-executes self as job A.
func startJobA(self, dsn, s3URL, svcURL string, ttl time.Duration) (*proc, error) {
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envDSN+"="+dsn, envS3+"="+s3URL, envService+"="+svcURL, envTTL+"="+ttl.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, in: in, lines: make(chan string, 100), done: make(chan struct{})}
	go func() { // owned by p: ends when the process's output does
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		_ = cmd.Wait()
	}()
	return p, nil
}

// send writes a line to job A.
func (p *proc) send(line string) error {
	_, err := io.WriteString(p.in, line+"\n")
	return err
}

// expect waits for a line of job A's containing word and returns it; its
// error quotes the last lines A printed meanwhile.
func (p *proc) expect(word string, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	var seen []string
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return "", fmt.Errorf("job A exited before printing %q (last lines: %s)", word, strings.Join(seen, " | "))
			}
			if strings.Contains(l, word) {
				return l, nil
			}
			if seen = append(seen, l); len(seen) > 10 {
				seen = seen[1:]
			}
		case <-deadline:
			return "", fmt.Errorf("job A did not print %q within %v (last lines: %s)", word, timeout, strings.Join(seen, " | "))
		}
	}
}

// stop ends job A (thawing it first, in case it is frozen) and waits for it.
func (p *proc) stop() {
	go func() { // owned by stop: ends when the reader closes lines
		for range p.lines {
		}
	}()
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
