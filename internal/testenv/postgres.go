package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is a private PostgreSQL cluster the test owns, started by
// StartPostgres: its own data directory (initdb), a postmaster child process
// on a free 127.0.0.1 port, trust authentication for the superuser
// "postgres". The embedded Process reports on it (PID, Alive, LogTail).
// Every server process the postmaster starts makes itself a process group
// leader (setsid), so Kill, Pause and Resume are overridden to signal them
// one by one as well; Stop and Restart use PostgreSQL's fast shutdown, and
// Restart keeps the port and the data.
type Postgres struct {
	*Process
	port    int
	dataDir string
}

// PostgresOption configures StartPostgres.
type PostgresOption func(*postgresConfig)

type postgresConfig struct {
	settings []string // "name=value" for -c
}

// WithPostgresSetting sets a server configuration parameter (postgres -c
// name=value), after those StartPostgres sets; later settings win. Default:
// none.
func WithPostgresSetting(name, value string) PostgresOption {
	return func(c *postgresConfig) { c.settings = append(c.settings, name+"="+value) }
}

// postgresStopGrace bounds a fast shutdown before Stop falls back to SIGKILL.
const postgresStopGrace = 10 * time.Second

// StartPostgres creates a PostgreSQL cluster in a new temporary directory and
// starts its postmaster in the foreground on a free 127.0.0.1 port:
//
//	initdb -D D/data -U postgres -A trust -E UTF8 --locale=C.UTF-8 -N
//	postgres -D D/data -c listen_addresses=127.0.0.1 -p P -k D
//	         -c fsync=off -c synchronous_commit=off -c full_page_writes=off
//	         -c max_connections=300
//
// The binaries come from the newest /usr/lib/postgresql/*/bin (Debian package
// postgresql), or from $PATH; the test is skipped, or fails under CI=true,
// when they are missing. PostgreSQL refuses to run as root: when the test runs
// as root, initdb and the postmaster run as the user "postgres" (through
// setpriv, which execs the server, so PID is the postmaster's and Pdeathsig
// still kills it if the test binary dies), and the directory is given to
// that user.
//
// It returns once the server accepts a connection from a backend whose parent
// is the child postmaster, so a leftover server on the same port cannot pass
// for it; it retries on another port when the port is taken, three attempts
// in all, and fails the test, quoting the server's log, otherwise. The server
// is stopped and its directory removed in t.Cleanup.
//
// Durability: Stop and Restart keep every committed transaction. Kill keeps
// those that committed with synchronous_commit=on (set it in the session or
// transaction: the server default here is off, so other recent commits may be
// lost, as on a crash); fsync=off only loses data on a machine crash.
func StartPostgres(t testing.TB, opts ...PostgresOption) *Postgres {
	t.Helper()
	var cfg postgresConfig
	for _, o := range opts {
		o(&cfg)
	}
	binDir := postgresBinDir(t)
	dir, runAs := postgresDir(t)
	dataDir := filepath.Join(dir, "data")

	initdb := append(slices.Clone(runAs), filepath.Join(binDir, "initdb"), "-D", dataDir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C.UTF-8", "-N")
	cmd := exec.Command(initdb[0], initdb[1:]...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}

	return startRetrying(t, "StartPostgres", func() (*Postgres, error) {
		port := FreePort(t)
		argv := append(slices.Clone(runAs), filepath.Join(binDir, "postgres"), "-D", dataDir,
			"-c", "listen_addresses=127.0.0.1", "-p", strconv.Itoa(port), "-k", dir,
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
			"-c", "max_connections=300")
		for _, s := range cfg.settings {
			argv = append(argv, "-c", s)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p := NewProcess(t, ProcessConfig{
			Name:      "postgres",
			Path:      argv[0],
			Args:      argv[1:],
			Dir:       dir,
			Ports:     []int{port},
			StopGrace: postgresStopGrace,
			Ready:     func(ctx context.Context, pid int) error { return postgresReady(ctx, addr, pid) },
		})
		pg := &Postgres{Process: p, port: port, dataDir: dataDir}
		// Registered after NewProcess's Stop, so it runs first: a fast
		// shutdown, which does not wait for clients to disconnect.
		t.Cleanup(pg.Stop)
		if err := p.Start(); err != nil {
			return nil, err
		}
		return pg, nil
	})
}

// postgresBinDir returns the directory of initdb and postgres.
func postgresBinDir(t testing.TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "postgres")) && isExecutable(filepath.Join(d, "initdb")) {
			return d
		}
	}
	return filepath.Dir(Binary(t, "initdb", "postgresql"))
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// postgresDir creates the cluster's directory and returns it with the
// command prefix that runs a program as its owner: setpriv to the user
// "postgres" when the test runs as root, nothing otherwise.
func postgresDir(t testing.TB) (string, []string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return t.TempDir(), nil
	}
	setpriv := Binary(t, "setpriv", "util-linux")
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("testenv: running as root, and there is no user postgres to run PostgreSQL as (Debian package postgresql creates it): %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	// Not t.TempDir: its parent is private to root, and postgres must reach
	// the directory. Removed after the server stops (cleanups run last-in,
	// first-out, and this one is registered first).
	dir, err := os.MkdirTemp("", "dlock-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("testenv: removing %s: %v", dir, err)
		}
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return dir, []string{setpriv, "--reuid=" + u.Uid, "--regid=" + u.Gid, "--init-groups", "--pdeathsig=KILL", "--"}
}

// Port returns the server's TCP port on 127.0.0.1.
func (p *Postgres) Port() int { return p.port }

// Addr returns the server's address, "127.0.0.1:PORT".
func (p *Postgres) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// URL returns a URL for the database "postgres" as the superuser "postgres"
// (no password: trust authentication), without TLS:
// "postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable".
func (p *Postgres) URL() string {
	return "postgres://postgres@" + p.Addr() + "/postgres?sslmode=disable"
}

// DataDir returns the cluster's data directory.
func (p *Postgres) DataDir() string { return p.dataDir }

// Stop shuts the server down with a fast shutdown (SIGINT to the postmaster:
// sessions are terminated, not waited for), sends SIGKILL to the process
// group if it has not exited within 10s, and waits until it has exited. It is
// idempotent and does nothing if the server is not running.
func (p *Postgres) Stop() {
	p.life.Lock()
	defer p.life.Unlock()
	p.fastStop()
}

func (p *Postgres) fastStop() {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if !p.Alive() {
		return
	}
	p.resume() // a stopped process ignores the shutdown request until continued
	// To the postmaster only: SIGINT means "cancel the query" to a backend.
	// The postmaster ends its children itself, and exits last.
	_ = syscall.Kill(p.PID(), syscall.SIGINT)
	timer := time.NewTimer(postgresStopGrace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		p.killAll()
	}
}

// Kill sends SIGKILL to the postmaster and to every server process it
// started, and waits until all of them have exited, so that a Restart finds
// no process still attached to the old shared memory. A killed server starts
// again with Restart, through crash recovery.
func (p *Postgres) Kill() {
	p.life.Lock()
	defer p.life.Unlock()
	p.killAll()
}

func (p *Postgres) killAll() {
	if !p.Alive() {
		return
	}
	post := p.PID()
	_ = syscall.Kill(post, syscall.SIGSTOP) // it forks no more children from here on
	kids := childPIDs(post)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	p.kill()
	deadline := time.Now().Add(10 * time.Second)
	for _, k := range kids {
		for !exited(k) {
			if time.Now().After(deadline) {
				p.t.Errorf("testenv: server process %d survived SIGKILL for 10s", k)
				break
			}
			time.Sleep(time.Millisecond) // no event announces another process's exit
		}
	}
}

// Pause stops the postmaster and every server process it started with
// SIGSTOP: sessions stay connected, but nothing answers until Resume. Stop,
// Restart and the cleanup resume the server first.
func (p *Postgres) Pause() {
	if !p.Alive() {
		p.t.Errorf("testenv: Pause: %s is not running", p.cfg.Name)
		return
	}
	post := p.PID()
	_ = syscall.Kill(post, syscall.SIGSTOP)
	kids := childPIDs(post)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGSTOP)
	}
	for _, pid := range append([]int{post}, kids...) {
		waitStopped(p.t, pid)
	}
}

// Resume continues a paused server with SIGCONT.
func (p *Postgres) Resume() {
	if !p.Alive() {
		p.t.Errorf("testenv: Resume: %s is not running", p.cfg.Name)
		return
	}
	p.resume()
}

func (p *Postgres) resume() {
	post := p.PID()
	for _, k := range childPIDs(post) {
		_ = syscall.Kill(k, syscall.SIGCONT)
	}
	_ = syscall.Kill(post, syscall.SIGCONT)
}

// childPIDs returns the live children of pid, from /proc.
func childPIDs(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var kids []int
	for _, e := range entries {
		k, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentPID(k); err == nil && ppid == pid {
			kids = append(kids, k)
		}
	}
	return kids
}

// exited reports whether pid has exited (it is gone, or a zombie).
func exited(pid int) bool {
	_, err := parentPID(pid)
	return err != nil
}

// Restart stops the server (see Stop) if it is running and starts it again
// on the same port and data directory, waiting until it accepts connections.
// A killed server goes through crash recovery, which keeps every committed
// transaction. It fails the test with t.Fatalf if the server does not become
// ready, so it must be called from the goroutine running the test.
func (p *Postgres) Restart() {
	p.t.Helper()
	p.life.Lock()
	defer p.life.Unlock()
	p.fastStop()
	if err := p.start(); err != nil {
		p.t.Fatalf("testenv: restarting %s: %v", p.cfg.Name, err)
	}
}

// TerminateBackend ends the server process (backend) pid as
// pg_terminate_backend does — SIGTERM — and waits until it has exited, so
// that its session and every lock it held are gone when it returns. It fails
// the test if pid is not a backend of this server or does not exit within
// 10s.
func (p *Postgres) TerminateBackend(t testing.TB, pid int) {
	t.Helper()
	post := p.PID()
	if ppid, err := parentPID(pid); err != nil || ppid != post {
		t.Fatalf("testenv: TerminateBackend(%d): not a backend of the postmaster %d (parent %d, %v)", pid, post, ppid, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("testenv: TerminateBackend(%d): %v", pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Gone, or already reaped and the PID reused by someone else's child.
		if ppid, err := parentPID(pid); err != nil || ppid != post {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: TerminateBackend(%d): still running after 10s", pid)
		}
		time.Sleep(2 * time.Millisecond) // no event announces another process's exit
	}
}

// parentPID reads the parent of pid from /proc. A zombie counts as exited.
func parentPID(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...; comm may contain spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return strconv.Atoi(f[1])
}

// postgresProbeTimeout bounds one readiness probe.
const postgresProbeTimeout = time.Second

// postgresReady returns nil once a session can be started on addr as the
// user postgres and the backend serving it is a child of the postmaster pid.
func postgresReady(ctx context.Context, addr string, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, postgresProbeTimeout)
	defer cancel()
	c, err := dialPostgres(ctx, addr)
	if err != nil {
		return err
	}
	defer c.close()
	if ppid, err := parentPID(c.backendPID); err != nil || ppid != pid {
		return fmt.Errorf("%s is served by backend %d whose parent is %d, not the child postmaster %d (%v)", addr, c.backendPID, ppid, pid, err)
	}
	return nil
}

// pgConn is a pgx connection as the user postgres, database postgres, with
// the simple query protocol (so that it also works through PgBouncer in
// transaction mode), for readiness probes and tests.
type pgConn struct {
	conn       *pgx.Conn
	ctx        context.Context // bounds every exchange until close
	backendPID int
}

// dialPostgres connects to addr as the user postgres, database postgres.
// ctx bounds and can cancel every exchange until close.
func dialPostgres(ctx context.Context, addr string) (*pgConn, error) {
	cfg, err := pgx.ParseConfig("postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=5")
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &pgConn{conn: conn, ctx: ctx, backendPID: int(conn.PgConn().PID())}, nil
}

// query runs sql and returns the first column of every row as text, NULL as
// "".
func (c *pgConn) query(sql string) ([]string, error) {
	rows, err := c.conn.Query(c.ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		v := ""
		if len(vals) > 0 && vals[0] != nil {
			v = fmt.Sprint(vals[0])
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// close ends the session and the connection.
func (c *pgConn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), postgresProbeTimeout)
	defer cancel()
	_ = c.conn.Close(ctx)
}

// PgBouncer is a pgbouncer the test owns, in front of a Postgres, started by
// StartPgBouncer. The embedded Process controls it.
type PgBouncer struct {
	*Process
	port int
}

// StartPgBouncer starts pgbouncer (Debian package pgbouncer; the test is
// skipped, or fails under CI=true, when it is missing) on a free 127.0.0.1
// port in front of pg's database "postgres", with trust authentication and
// the given pool_mode ("session", "transaction" or "statement"). Like the
// server it runs as the user postgres when the test runs as root. It returns
// once pgbouncer serves a session, and stops it in t.Cleanup.
func StartPgBouncer(t testing.TB, pg *Postgres, poolMode string) *PgBouncer {
	t.Helper()
	bin := Binary(t, "pgbouncer", "pgbouncer")
	dir, runAs := postgresDir(t)
	users := filepath.Join(dir, "users.txt")
	if err := os.WriteFile(users, []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return startRetrying(t, "StartPgBouncer", func() (*PgBouncer, error) {
		port := FreePort(t)
		ini := filepath.Join(dir, "pgbouncer.ini")
		conf := fmt.Sprintf(`[databases]
postgres = host=127.0.0.1 port=%d dbname=postgres user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
max_client_conn = 200
default_pool_size = 20
server_login_retry = 1
`, pg.Port(), port, users, poolMode)
		if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		argv := append(slices.Clone(runAs), bin, ini)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p := NewProcess(t, ProcessConfig{
			Name:  "pgbouncer",
			Path:  argv[0],
			Args:  argv[1:],
			Dir:   dir,
			Ports: []int{port},
			Ready: func(ctx context.Context, pid int) error {
				ctx, cancel := context.WithTimeout(ctx, postgresProbeTimeout)
				defer cancel()
				c, err := dialPostgres(ctx, addr)
				if err != nil {
					return err
				}
				defer c.close()
				_, err = c.query("SELECT 1")
				return err
			},
		})
		if err := p.Start(); err != nil {
			return nil, err
		}
		return &PgBouncer{Process: p, port: port}, nil
	})
}

// Addr returns pgbouncer's host:port.
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// URL returns a URL for the database "postgres" through pgbouncer, as the
// user postgres, without TLS.
func (b *PgBouncer) URL() string {
	return "postgres://postgres@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) + "/postgres?sslmode=disable"
}
