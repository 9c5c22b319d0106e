//go:build unix

// Command leader shows leader election with fencing tokens across two
// processes, and why the token matters.
//
// The program starts two candidate processes (itself, re-executed), alice and
// bob, which campaign in one election with package election and, while
// leading, write to a resource this program serves on loopback with every
// write carrying the term's token. The resource checks tokens with a
// fencing.Guard. Once alice leads and has written, the program freezes her
// process (SIGSTOP) for longer than her term's TTL — a GC pause, a frozen VM.
// Bob becomes leader and writes. Then the program thaws alice: her write in
// flight goes out with her old token, and the resource rejects it, while
// bob's are accepted. The program prints the timeline and exits 0 if every
// invariant held.
//
// By default the candidates elect on an etcd server the program starts
// in-process (nothing to install); -dsn elects on any backend that both
// processes can reach.
//
//	cd examples && go run ./leader
//	cd examples && go run ./leader -dsn redis://127.0.0.1:6379/0
//	cd examples && go run ./leader -dsn zk://127.0.0.1:2181/dlock
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
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
	_ "github.com/dlock-go/dlock/etcd" // registers etcd://
	"github.com/dlock-go/dlock/examples/internal/embedetcd"
	"github.com/dlock-go/dlock/fencing"
	_ "github.com/dlock-go/dlock/postgres"  // registers postgres://
	_ "github.com/dlock-go/dlock/redis"     // registers redis://
	_ "github.com/dlock-go/dlock/zookeeper" // registers zk://
)

// The candidate processes learn their part from the environment.
const (
	envName     = "DLOCK_LEADER_EXAMPLE_NAME"
	envDSN      = "DLOCK_LEADER_EXAMPLE_DSN"
	envResource = "DLOCK_LEADER_EXAMPLE_RESOURCE"
	envTTL      = "DLOCK_LEADER_EXAMPLE_TTL"
)

const electionName = "examples/leader"

func main() {
	if name := os.Getenv(envName); name != "" {
		if err := candidate(name); err != nil {
			fmt.Fprintln(os.Stderr, name+":", err)
			os.Exit(1)
		}
		return
	}
	dsn := flag.String("dsn", "", "backend both candidates reach (etcd://host:2379/prefix, redis://host:port/db, zk://…); default: an embedded etcd server")
	ttl := flag.Duration("ttl", 2*time.Second, "the term's TTL; alice is frozen for 2× this")
	flag.Parse()
	if err := run(os.Args[0], *dsn, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "leader:", err)
		os.Exit(1)
	}
}

// resource is what the leaders write to: it accepts a write only if its token
// is not older than one it has accepted.
type resource struct {
	guard    fencing.Guard
	mu       sync.Mutex
	accepted map[string]int // writes accepted per candidate
	rejected map[string]int
}

func (r *resource) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	who := req.URL.Query().Get("who")
	token, err := strconv.ParseUint(req.URL.Query().Get("token"), 10, 64)
	if err != nil || who == "" {
		http.Error(w, "want ?who=NAME&token=N", http.StatusBadRequest)
		return
	}
	err = r.guard.Do("the-resource", dlock.Token(token), func() error { return nil })
	r.mu.Lock()
	defer r.mu.Unlock()
	if errors.Is(err, fencing.ErrStaleToken) {
		r.rejected[who]++
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	r.accepted[who]++
}

func (r *resource) counts(who string) (accepted, rejected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted[who], r.rejected[who]
}

// proc is a running candidate process and the lines it prints.
type proc struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser // its standard input
	lines chan string
	done  chan struct{}
}

func run(self, dsn string, ttl time.Duration) error {
	start := time.Now()
	say := func(who, format string, args ...any) {
		fmt.Printf("%+7.3fs  %-6s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}
	if dsn == "" {
		srv, err := embedetcd.Start("leader")
		if err != nil {
			return fmt.Errorf("embedded etcd: %w", err)
		}
		defer srv.Close()
		dsn = srv.DSN("/leader-example")
		say("setup", "started an embedded etcd server on %s (-dsn picks another backend)", srv.Addr)
	}

	res := &resource{accepted: map[string]int{}, rejected: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: res, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	defer func() {
		_ = hs.Close()
		<-served
	}()
	url := "http://" + ln.Addr().String() + "/write"
	say("setup", "the resource checks tokens at %s", url)

	procs := map[string]*proc{}
	for _, name := range []string{"alice", "bob"} {
		p, err := startCandidate(self, name, dsn, url, ttl)
		if err != nil {
			return err
		}
		defer p.stop()
		procs[name] = p
	}
	alice, bob := procs["alice"], procs["bob"]

	// alice campaigns first; bob joins once she leads.
	timeout := 30*time.Second + 10*ttl
	line, err := alice.expect("leading", timeout)
	if err != nil {
		return err
	}
	say("alice", "%s", line)
	if err := bob.send("campaign"); err != nil {
		return err
	}
	if line, err = alice.expect("accepted", timeout); err != nil {
		return err
	}
	say("alice", "%s", line)

	freeze := 2 * ttl
	say("alice", "process frozen (SIGSTOP) for %v, past her TTL of %v…", freeze, ttl)
	if err := alice.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	frozenAt := time.Now()
	if err := alice.send("go"); err != nil { // read once she thaws: her next write is due then
		return err
	}
	if line, err = bob.expect("leading", timeout); err != nil {
		return fmt.Errorf("bob never led while alice was frozen: %w", err)
	}
	say("bob", "%s", line)
	if line, err = bob.expect("accepted", timeout); err != nil {
		return err
	}
	say("bob", "%s", line)
	if err := bob.send("go"); err != nil {
		return err
	}
	if rest := freeze - time.Since(frozenAt); rest > 0 {
		time.Sleep(rest)
	}
	if err := alice.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	say("alice", "thawed (SIGCONT); her write in flight goes out with her old token")
	if line, err = alice.expect("REJECTED", timeout); err != nil {
		return fmt.Errorf("alice's stale write was not rejected: %w", err)
	}
	say("alice", "%s", line)
	if line, err = alice.expect("lost", timeout); err != nil {
		return err
	}
	say("alice", "%s", line)

	_, aliceRejected := res.counts("alice")
	bobAccepted, bobRejected := res.counts("bob")
	say("done", "bob: %d writes accepted, %d rejected; alice: %d stale writes rejected", bobAccepted, bobRejected, aliceRejected)
	if aliceRejected == 0 || bobAccepted == 0 || bobRejected != 0 {
		return fmt.Errorf("invariant broken: alice rejected %d, bob accepted %d and rejected %d", aliceRejected, bobAccepted, bobRejected)
	}
	return nil
}

// startCandidate re-executes self as the candidate name.
func startCandidate(self, name, dsn, url string, ttl time.Duration) (*proc, error) {
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envName+"="+name, envDSN+"="+dsn, envResource+"="+url, envTTL+"="+ttl.String())
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
	p := &proc{name: name, cmd: cmd, in: in, lines: make(chan string, 100), done: make(chan struct{})}
	go func() { // owned by p: ends when the process's output does
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		_ = cmd.Wait()
	}()
	if name == "alice" {
		if err := p.send("campaign"); err != nil {
			p.stop()
			return nil, err
		}
	}
	return p, nil
}

// send writes a command line to the candidate.
func (p *proc) send(line string) error {
	_, err := io.WriteString(p.in, line+"\n")
	return err
}

// expect waits for a line of p's containing word, and returns it. Its error
// quotes the last lines p printed meanwhile.
func (p *proc) expect(word string, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	var seen []string
	said := func() string {
		if len(seen) == 0 {
			return "it printed nothing meanwhile"
		}
		return "its last lines: " + strings.Join(seen, " | ")
	}
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return "", fmt.Errorf("%s exited before printing %q (%s)", p.name, word, said())
			}
			if strings.Contains(l, word) {
				return l, nil
			}
			if seen = append(seen, l); len(seen) > 10 {
				seen = seen[1:]
			}
		case <-deadline:
			return "", fmt.Errorf("%s did not print %q within %v (%s)", p.name, word, timeout, said())
		}
	}
}

// stop ends the candidate (thawing it first, in case it is frozen) and waits
// for it.
func (p *proc) stop() {
	go func() { // owned by stop: ends when the reader closes lines, at the end of the output
		for range p.lines { // nobody expects lines any more: keep the reader from blocking on them
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

// candidate is a candidate process: once told to campaign (a line on its
// standard input), it runs in the election and, while leading, writes to the
// resource every 100ms with its term's token. Its write loop looks for the
// loss of leadership only between writes, as code with a request in flight
// does. After its first write it waits for a line "go" on its standard input
// (once per process), so that the program can freeze it between two writes.
func candidate(name string) error {
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	locker, err := dlock.Open(ctx, os.Getenv(envDSN), dlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer locker.Close()
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil { // "campaign"
		return err
	}
	url := os.Getenv(envResource)
	held := false // this candidate has waited for "go" after its first write
	err = election.Run(ctx, election.Config{Locker: locker, Name: electionName, Value: name,
		OnStoppedLeading: func(ld *election.Leadership, err error) {
			fmt.Printf("lost leadership of term %v: %v\n", ld.Token(), err)
		},
		OnStartedLeading: func(ctx context.Context, ld *election.Leadership) error {
			fmt.Printf("leading with token %v\n", ld.Token())
			for {
				time.Sleep(100 * time.Millisecond) // work
				status, err := write(url, name, ld.Token())
				switch {
				case err != nil:
					// A real client retries a write that got no answer; say so,
					// so that a run that goes wrong shows why.
					fmt.Printf("write with token %v failed (%v); trying again\n", ld.Token(), err)
					if ctx.Err() != nil {
						return nil // campaign again
					}
					continue
				case status == http.StatusConflict:
					fmt.Printf("write with token %v REJECTED by the resource (stale)\n", ld.Token())
				default:
					fmt.Printf("write with token %v accepted\n", ld.Token())
				}
				if !held {
					// The program holds a candidate after its first write until
					// it says "go": a freeze it injects lands between that write
					// and this wait (it sends "go" only once the process is
					// stopped), and the next write goes out with this term's
					// token whatever happened meanwhile. So the term's end is
					// not looked at here: a freeze that lands before this line
					// would otherwise end the term without that write.
					held = true
					if _, err := in.ReadString('\n'); err != nil {
						return err
					}
					continue
				}
				if ctx.Err() != nil {
					return nil // campaign again
				}
			}
		}})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// client is the candidates' HTTP client: a write that gets no answer in 5s
// has failed.
var client = &http.Client{Timeout: 5 * time.Second}

func write(url, who string, token dlock.Token) (int, error) {
	resp, err := client.Post(fmt.Sprintf("%s?who=%s&token=%d", url, who, token), "text/plain", nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// signalContext is cancelled by SIGTERM or SIGINT.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	go func() { // owned by the process: ends with the first signal or cancel
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
