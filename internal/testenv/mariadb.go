package testenv

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// MariaDB is a mariadbd the test owns, started by StartMariaDB. The embedded
// Process controls it (Kill and Restart keep its data directory: a SIGKILL
// then a restart through InnoDB's crash recovery; Pause and Resume stop and
// continue it).
type MariaDB struct {
	*Process
	port    int
	dataDir string
}

// StartMariaDB creates a MariaDB data directory in a new temporary directory
// and starts mariadbd in the foreground on a free 127.0.0.1 port (Debian
// package mariadb-server; the test is skipped, or fails under CI=true, when
// it is missing):
//
//	mariadb-install-db --no-defaults --datadir=D/data --tmpdir=D/tmp --auth-root-authentication-method=normal --skip-test-db
//	mariadbd --no-defaults --datadir=D/data --tmpdir=D/tmp --port=P --bind-address=127.0.0.1 --socket=D/sock
//	         --skip-log-bin --skip-name-resolve --innodb-buffer-pool-size=64M
//
// root connects over TCP from 127.0.0.1 without a password. Commits are
// durable (innodb_flush_log_at_trx_commit=1, the default): Kill then Restart
// keeps every committed transaction. It returns once the server sends its
// handshake, retries on another port when the port is taken, and stops the
// server in t.Cleanup.
func StartMariaDB(t testing.TB) *MariaDB {
	t.Helper()
	bin := Binary(t, "mariadbd", "mariadb-server")
	install := Binary(t, "mariadb-install-db", "mariadb-server")
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	tmpDir := filepath.Join(dir, "tmp") // not /tmp: servers starting at once clash on temporary table names
	if err := os.Mkdir(tmpDir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	args := []string{"--no-defaults", "--datadir=" + dataDir, "--tmpdir=" + tmpDir, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	cmd := exec.Command(install, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: mariadb-install-db: %v\n%s", err, out)
	}
	return startRetrying(t, "StartMariaDB", func() (*MariaDB, error) {
		port := FreePort(t)
		argv := []string{"--no-defaults", "--datadir=" + dataDir, "--tmpdir=" + tmpDir, "--port=" + strconv.Itoa(port),
			"--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "sock"),
			"--pid-file=" + filepath.Join(dir, "mariadbd.pid"), "--log-error=" + filepath.Join(dir, "err.log"),
			"--skip-log-bin", "--skip-name-resolve", "--innodb-buffer-pool-size=64M", "--max-connections=500"}
		if os.Geteuid() == 0 {
			argv = append(argv, "--user=root")
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p := NewProcess(t, ProcessConfig{
			Name:         "mariadbd",
			Path:         bin,
			Args:         argv,
			Dir:          dir,
			Ports:        []int{port},
			ReadyTimeout: 30 * time.Second,
			Ready:        func(ctx context.Context, _ int) error { return mariadbReady(ctx, addr) },
		})
		if err := p.Start(); err != nil {
			return nil, err
		}
		return &MariaDB{Process: p, port: port, dataDir: dataDir}, nil
	})
}

// mariadbReady reads the server's handshake packet (protocol version 10).
func mariadbReady(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(time.Second))
	}
	hdr := make([]byte, 5) // 3 bytes length, 1 sequence, 1 protocol version
	if _, err := io.ReadFull(c, hdr); err != nil {
		return err
	}
	if hdr[4] != 10 {
		return fmt.Errorf("not a MySQL handshake (first byte %d)", hdr[4])
	}
	return nil
}

// Port returns the server's port.
func (m *MariaDB) Port() int { return m.port }

// Addr returns the server's address, "127.0.0.1:PORT".
func (m *MariaDB) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) }

// DSN returns a go-sql-driver/mysql DSN for the database "mysql" as root
// (no password): "root@tcp(127.0.0.1:PORT)/mysql".
func (m *MariaDB) DSN() string { return "root@tcp(" + m.Addr() + ")/mysql" }

// URL returns the server as a URL with the given scheme, as root, for the
// database "mysql": "SCHEME://root@127.0.0.1:PORT/mysql".
func (m *MariaDB) URL(scheme string) string { return scheme + "://root@" + m.Addr() + "/mysql" }
