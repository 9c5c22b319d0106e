package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startAttempts is how many ports a Start helper tries when the port it
// picked is taken before the server binds it.
const startAttempts = 3

// Redis is a redis-server the test owns, started by StartRedis. The embedded
// Process controls it (Kill, Pause, Resume, Restart, Stop, PID, Alive);
// Restart keeps its port and data directory.
type Redis struct {
	*Process
	port int
}

// RedisOption configures StartRedis.
type RedisOption func(*redisConfig)

type redisConfig struct {
	persistence bool
	args        []string
}

// WithPersistence makes the server log every write to an append-only file in
// its data directory and fsync it before replying (appendonly yes,
// appendfsync always), so that data written before a Kill is there after
// Restart. Default: no persistence (an empty --save, so no RDB snapshots, and
// --appendonly no), so a restarted server is empty.
func WithPersistence() RedisOption {
	return func(c *redisConfig) { c.persistence = true }
}

// WithRedisArgs appends raw redis-server arguments, such as
// "--maxmemory", "10mb", after those StartRedis sets; later arguments win.
// Default: none.
func WithRedisArgs(args ...string) RedisOption {
	return func(c *redisConfig) { c.args = append(c.args, args...) }
}

// StartRedis starts redis-server (Debian package redis-server; the test is
// skipped, or fails under CI=true, when it is missing) in the foreground on
// a free 127.0.0.1 port with a new t.TempDir() as its data directory:
//
//	redis-server --port P --bind 127.0.0.1 --save '' --appendonly no --dir D
//
// It returns once the server answers PING and INFO reports the PID of the
// child, so a leftover server on the same port cannot pass for it. If the
// port is taken before the server binds it, it retries on another port, three
// attempts in all. It fails the test, quoting the server's output, if the
// server does not become ready within 10s. The server is stopped in
// t.Cleanup. See WithPersistence and WithRedisArgs for the options.
func StartRedis(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	var cfg redisConfig
	for _, o := range opts {
		o(&cfg)
	}
	bin := Binary(t, "redis-server", "redis-server")
	dir := t.TempDir()
	return startRetrying(t, "StartRedis", func() (*Redis, error) {
		port := FreePort(t)
		args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--dir", dir}
		if cfg.persistence {
			args = append(args, "--appendonly", "yes", "--appendfsync", "always")
		} else {
			args = append(args, "--appendonly", "no")
		}
		args = append(args, cfg.args...)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p := NewProcess(t, ProcessConfig{
			Name:  "redis-server",
			Path:  bin,
			Args:  args,
			Dir:   dir,
			Ports: []int{port},
			Ready: func(ctx context.Context, pid int) error { return redisReady(ctx, addr, pid) },
		})
		if err := p.Start(); err != nil {
			return nil, err
		}
		return &Redis{Process: p, port: port}, nil
	})
}

// Port returns the server's TCP port on 127.0.0.1.
func (r *Redis) Port() int { return r.port }

// Addr returns the server's address, "127.0.0.1:PORT".
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL returns the server's URL for database 0, "redis://127.0.0.1:PORT/0".
func (r *Redis) URL() string { return "redis://" + r.Addr() + "/0" }

// redisProbeTimeout bounds one readiness probe.
const redisProbeTimeout = time.Second

// redisReady sends PING and INFO server over raw RESP to addr and returns nil
// if the server answers +PONG and reports process_id pid.
func redisReady(ctx context.Context, addr string, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, redisProbeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return err
		}
	}
	// Cut the exchange short when ctx is cancelled (the child exited). The
	// AfterFunc goroutine exists only once ctx is done; wait for it to end.
	unblocked := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(unblocked)
		_ = conn.SetDeadline(time.Now())
	})
	defer func() {
		if !stop() {
			<-unblocked
		}
	}()
	if _, err := io.WriteString(conn, "PING\r\nINFO server\r\n"); err != nil {
		return err
	}
	rd := bufio.NewReader(conn)
	line, err := rd.ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimRight(line, "\r\n"); line != "+PONG" {
		// e.g. "-LOADING Redis is loading the dataset in memory"
		return fmt.Errorf("PING answered %q", line)
	}
	line, err = rd.ReadString('\n')
	if err != nil {
		return err
	}
	line = strings.TrimRight(line, "\r\n")
	if !strings.HasPrefix(line, "$") {
		return fmt.Errorf("INFO answered %q", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 {
		return fmt.Errorf("INFO answered %q", line)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return err
	}
	for _, l := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(l, "process_id:"); ok {
			if v != strconv.Itoa(pid) {
				return fmt.Errorf("%s is served by PID %s, not by the child PID %d", addr, v, pid)
			}
			return nil
		}
	}
	return errors.New("INFO server has no process_id")
}

// RestartEmpty kills the server with SIGKILL, removes its persistence files
// (the append-only directory and file, and RDB snapshots) from its data
// directory, and starts it again on the same port, waiting for readiness: a
// crash followed by a restart that lost every key, whatever the persistence
// settings. Like Restart, it fails the test with t.Fatalf if the server does
// not come back, so it must be called from the goroutine running the test.
func (r *Redis) RestartEmpty() {
	r.t.Helper()
	r.Kill()
	for _, pattern := range []string{"appendonlydir", "*.aof", "*.rdb"} {
		matches, err := filepath.Glob(filepath.Join(r.Dir(), pattern))
		if err != nil {
			r.t.Fatalf("testenv: RestartEmpty: %v", err)
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				r.t.Fatalf("testenv: RestartEmpty: %v", err)
			}
		}
	}
	r.Restart()
}
