package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/sqltable"
)

const zoneTTL = 15 * time.Second

// mariaDBInZone opens srv as database/sql's "mysql" with every session in
// the time zone zone (go-sql-driver sets the system variable at connect);
// extra are more DSN parameters.
func mariaDBInZone(t *testing.T, srv *testenv.MariaDB, zone, extra string) *sql.DB {
	t.Helper()
	dsn := srv.DSN() + "?time_zone=" + url.QueryEscape("'"+zone+"'") + extra
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	checkZone(t, db, "SELECT @@session.time_zone", zone)
	return db
}

// postgresInZone opens srv with every session's TimeZone set to zone.
func postgresInZone(t *testing.T, srv *testenv.Postgres, zone string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["timezone"] = zone
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	checkZone(t, db, "SELECT current_setting('TimeZone')", zone)
	return db
}

// checkZone proves the test's premise: db's sessions are in zone.
func checkZone(t *testing.T, db *sql.DB, query, zone string) {
	t.Helper()
	var got string
	if err := db.QueryRowContext(testCtx(t), query).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != zone {
		t.Fatalf("session time zone %q, want %q", got, zone)
	}
}

func newLocker(t *testing.T, db *sql.DB, dialect string) (dlock.Locker, error) {
	t.Helper()
	l, err := sqltable.New(testCtx(t), db, dialect, nil, dlock.WithTTL(zoneTTL))
	if err == nil {
		t.Cleanup(func() { _ = l.Close() })
	}
	return l, err
}

// exclusiveAcrossZones takes key on a and checks b, whose sessions are in
// another time zone, is refused it and reads a as its holder with a grant
// time and an expiry by the real clock; then the same the other way round.
func exclusiveAcrossZones(ctx context.Context, a, b dlock.Locker, key string) error {
	for _, p := range []struct {
		name           string
		holder, other  dlock.Locker
		hname, onename string
	}{{"A then B", a, b, "A", "B"}, {"B then A", b, a, "B", "A"}} {
		before := time.Now()
		lease, err := p.holder.Acquire(ctx, key)
		if err != nil {
			return fmt.Errorf("%s: %s's Acquire: %w", p.name, p.hname, err)
		}
		if got, err := p.other.TryAcquire(ctx, key); err == nil {
			_ = got.Release(ctx)
			_ = lease.Release(ctx)
			return fmt.Errorf("%s: while %s holds %q (token %d, TTL %v), %s's TryAcquire was granted token %d",
				p.name, p.hname, key, lease.Token(), zoneTTL, p.onename, got.Token())
		} else if !errors.Is(err, dlock.ErrNotAcquired) {
			return fmt.Errorf("%s: %s's TryAcquire: %w, want ErrNotAcquired", p.name, p.onename, err)
		}
		info, err := dlock.Inspect(ctx, p.other, key)
		after := time.Now()
		if err != nil {
			return fmt.Errorf("%s: %s's Inspect: %w", p.name, p.onename, err)
		}
		// Granted has the database's microseconds; the server's clock is
		// this machine's.
		if !info.Held || info.Token != uint64(lease.Token()) ||
			info.Granted.Before(before.Add(-time.Millisecond)) || info.Granted.After(after) ||
			info.Expires.Before(before) || info.Expires.After(after.Add(zoneTTL)) {
			return fmt.Errorf("%s: %s's Inspect between %s and %s: %+v, want %s's token %d granted then, expiring within %v",
				p.name, p.onename, before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano), info, p.hname, lease.Token(), zoneTTL)
		}
		if err := lease.Release(ctx); err != nil {
			return fmt.Errorf("%s: %s's Release: %w", p.name, p.hname, err)
		}
	}
	return nil
}

// TestMySQLExpiryIgnoresSessionTimeZone: two lockers whose sessions are in
// different time zones (+00:00 and +02:00, each on its own *sql.DB) exclude
// each other: expiry is by UTC, not by the session's local time. One
// *sql.DB parses times, the other does not: Inspect works on both.
func TestMySQLExpiryIgnoresSessionTimeZone(t *testing.T) {
	srv := testenv.StartMariaDB(t)
	a, err := newLocker(t, mariaDBInZone(t, srv, "+00:00", "&parseTime=true"), sqltable.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newLocker(t, mariaDBInZone(t, srv, "+02:00", ""), sqltable.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	if err := exclusiveAcrossZones(testCtx(t), a, b, "zones/mysql"); err != nil {
		t.Fatal(err)
	}
}

// TestPostgresExpiryIgnoresSessionTimeZone: the same with PostgreSQL
// sessions whose TimeZone is 12 hours behind UTC and 14 hours ahead
// (timestamptz and clock_timestamp() are instants).
func TestPostgresExpiryIgnoresSessionTimeZone(t *testing.T) {
	srv := startPostgres(t)
	a, err := newLocker(t, postgresInZone(t, srv, "Etc/GMT+12"), sqltable.PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newLocker(t, postgresInZone(t, srv, "Pacific/Kiritimati"), sqltable.PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	if err := exclusiveAcrossZones(testCtx(t), a, b, "zones/postgres"); err != nil {
		t.Fatal(err)
	}
}

// TestPostgresRefusesTimestampWithoutTimeZone: a lock table made beforehand
// whose times are timestamp without time zone would compare them in each
// session's TimeZone: NewDriver refuses it with ErrTableFormat.
func TestPostgresRefusesTimestampWithoutTimeZone(t *testing.T) {
	srv := startPostgres(t)
	dbA := postgresInZone(t, srv, "Etc/GMT+12")
	if _, err := dbA.ExecContext(testCtx(t), `CREATE TABLE `+sqltable.DefaultTable+` (
	key text PRIMARY KEY, owner text NOT NULL, label text NOT NULL, token bigint NOT NULL,
	granted_at timestamp NOT NULL, expires_at timestamp NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	a, err := newLocker(t, dbA, sqltable.PostgreSQL)
	if err == nil {
		b, err := newLocker(t, postgresInZone(t, srv, "Pacific/Kiritimati"), sqltable.PostgreSQL)
		if err == nil {
			err = exclusiveAcrossZones(testCtx(t), a, b, "zones/timestamp")
		}
		t.Fatalf("New on a table with timestamp columns: no error, want ErrTableFormat (two zones: %v)", err)
	}
	if !errors.Is(err, sqltable.ErrTableFormat) {
		t.Fatalf("New on a table with timestamp columns: %v, want ErrTableFormat", err)
	}
	t.Log(err)
}

// oldMySQLTable is the lock table of dlock's MySQL dialect before times were
// UTC: DATETIME(6) columns granted_at and expires_at, in the session's time
// zone.
const oldMySQLTable = "CREATE TABLE " + sqltable.DefaultTable + " (\n" +
	"\t`key`      VARBINARY(1024) NOT NULL PRIMARY KEY,\n" +
	"\towner      VARBINARY(64) NOT NULL,\n" +
	"\tlabel      VARBINARY(128) NOT NULL,\n" +
	"\ttoken      BIGINT NOT NULL,\n" +
	"\tgranted_at DATETIME(6) NOT NULL,\n" +
	"\texpires_at DATETIME(6) NOT NULL\n" +
	") ENGINE=InnoDB"

// oldClientRefresh is an older client's renewal: it names expires_at.
const oldClientRefresh = "UPDATE " + sqltable.DefaultTable + " SET expires_at = NOW(6) + INTERVAL 15 SECOND WHERE `key` = ? AND owner = ? AND expires_at > NOW(6)"

// columns lists the table's columns.
func columns(t *testing.T, db *sql.DB) string {
	t.Helper()
	var cols string
	if err := db.QueryRowContext(testCtx(t), "SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY ORDINAL_POSITION) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", sqltable.DefaultTable).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	return cols
}

// TestMySQLUpgradesAnOlderTable: on a table of an older version whose rows
// are all free or long expired, New renames the time columns (the new
// format's mark), so an older client's statements fail from then on instead
// of mixing time zones; the rows keep their tokens.
func TestMySQLUpgradesAnOlderTable(t *testing.T) {
	srv := testenv.StartMariaDB(t)
	ctx := testCtx(t)
	db := mariaDBInZone(t, srv, "+02:00", "")
	for _, stmt := range []string{oldMySQLTable,
		"INSERT INTO " + sqltable.DefaultTable + " VALUES ('free', '', '', 7, '1000-01-01', '1000-01-01')",
		"INSERT INTO " + sqltable.DefaultTable + " VALUES ('crashed', 'old-owner', 'old', 3, NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 1 DAY)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	l, err := newLocker(t, db, sqltable.MySQL)
	if err != nil {
		t.Fatalf("New on an older table with no row held: %v", err)
	}
	for key, want := range map[string]dlock.Token{"free": 8, "crashed": 4} {
		lease, err := l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire(%q) after the upgrade: %v", key, err)
		}
		if lease.Token() != want {
			t.Errorf("TryAcquire(%q) after the upgrade: token %d, want %d", key, lease.Token(), want)
		}
		var owner string
		if err := db.QueryRowContext(ctx, "SELECT owner FROM "+sqltable.DefaultTable+" WHERE `key` = ?", key).Scan(&owner); err != nil {
			t.Fatal(err)
		}
		_, err = db.ExecContext(ctx, oldClientRefresh, key, owner)
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1054 { // ER_BAD_FIELD_ERROR
			t.Errorf("an older client's renewal of %q after the upgrade: %v, want error 1054 (unknown column)", key, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("columns after the upgrade: %s", columns(t, db))
}

// TestMySQLRefusesToUpgradeWhileHeld: a row of an older table that an older
// client may still hold (its expiry, in an unknown time zone, is not surely
// past) makes New refuse with ErrTableFormat and leave the table as it is;
// once the row is freed, New upgrades it.
func TestMySQLRefusesToUpgradeWhileHeld(t *testing.T) {
	srv := testenv.StartMariaDB(t)
	ctx := testCtx(t)
	db := mariaDBInZone(t, srv, "+00:00", "")
	for _, stmt := range []string{oldMySQLTable,
		"INSERT INTO " + sqltable.DefaultTable + " VALUES ('held', 'old-owner', 'old', 5, NOW(6), NOW(6) + INTERVAL 15 SECOND)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	before := columns(t, db)
	_, err := newLocker(t, db, sqltable.MySQL)
	if !errors.Is(err, sqltable.ErrTableFormat) {
		t.Fatalf("New on an older table with a held row: %v, want ErrTableFormat", err)
	}
	t.Log(err)
	if after := columns(t, db); after != before {
		t.Fatalf("a refused upgrade changed the columns from %s to %s", before, after)
	}
	if _, err := db.ExecContext(ctx, oldClientRefresh, "held", "old-owner"); err != nil {
		t.Fatalf("an older client's renewal after the refusal: %v", err)
	}
	// What the error advises once no older client runs.
	if _, err := db.ExecContext(ctx, "UPDATE "+sqltable.DefaultTable+" SET owner = '', label = '', expires_at = '1000-01-01' WHERE owner <> ''"); err != nil {
		t.Fatal(err)
	}
	l, err := newLocker(t, db, sqltable.MySQL)
	if err != nil {
		t.Fatalf("New after the rows were freed: %v", err)
	}
	lease, err := l.TryAcquire(ctx, "held")
	if err != nil || lease.Token() != 6 {
		t.Fatalf("TryAcquire after the upgrade: %v, %v, want token 6", lease, err)
	}
	_ = lease.Release(ctx)
}

// TestMySQLUpgradeConcurrently: processes that start together on an older
// table all open it; one upgrades it.
func TestMySQLUpgradeConcurrently(t *testing.T) {
	srv := testenv.StartMariaDB(t)
	ctx := testCtx(t)
	db := mariaDBInZone(t, srv, "+00:00", "")
	if _, err := db.ExecContext(ctx, oldMySQLTable); err != nil {
		t.Fatal(err)
	}
	const openers = 8
	var wg sync.WaitGroup
	errs := make(chan error, openers)
	start := make(chan struct{})
	for range openers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := sqltable.NewDriver(ctx, db, sqltable.MySQL, nil)
			if err == nil {
				err = d.Close()
			}
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("NewDriver on an older table, %d at once: %v", openers, err)
		}
	}
	if cols := columns(t, db); !strings.Contains(cols, "expires_utc") {
		t.Fatalf("columns after the upgrade: %s", cols)
	}
}
