package sqltable

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"
)

// queryer is a *sql.DB or a *sql.Conn.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// timeColumns returns the types of table's columns named in names, by name;
// query takes the arguments args.
func timeColumns(ctx context.Context, q queryer, query string, args ...any) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		cols[strings.ToLower(name)] = strings.ToLower(typ)
	}
	return cols, rows.Err()
}

// checkPostgresTable refuses a table whose granted_at or expires_at is not
// timestamptz: a timestamp without time zone is read in each session's
// TimeZone, so sessions in different zones would disagree on expiry.
func checkPostgresTable(ctx context.Context, db *sql.DB, table string) error {
	cols, err := timeColumns(ctx, db, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attname IN ('granted_at', 'expires_at') AND NOT attisdropped`, table)
	if err != nil {
		return fmt.Errorf("read the lock table's columns: %w", err)
	}
	for _, name := range []string{"granted_at", "expires_at"} {
		if typ := cols[name]; typ != "timestamp with time zone" {
			if typ == "" {
				typ = "missing"
			}
			return fmt.Errorf("%w: table %s: column %s is %s, want timestamp with time zone "+
				"(a timestamp without time zone is read in each session's TimeZone); convert it "+
				"(ALTER TABLE %[2]s ALTER %[3]s TYPE timestamptz USING %[3]s AT TIME ZONE 'the zone its writers used') or name another table",
				ErrTableFormat, table, name, typ)
		}
	}
	return nil
}

// maxZoneOffset bounds how far a session's time zone can be from UTC
// (MySQL accepts offsets from -13:59 to +14:00): a time an older client
// wrote in its session's zone is past in UTC once it is this far behind.
const maxZoneOffset = 14 * time.Hour

// mysqlColumns reads the time columns of table ($1 schema or NULL for the
// session's database, $2 table).
const mysqlColumns = `SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = IFNULL(?, DATABASE()) AND TABLE_NAME = ?
AND COLUMN_NAME IN ('granted_at', 'expires_at', 'granted_utc', 'expires_utc')`

// mysqlTimeColumns returns the time columns of table.
func mysqlTimeColumns(ctx context.Context, q queryer, table string) (map[string]string, error) {
	var schema any
	name := table
	if s, n, ok := strings.Cut(table, "."); ok {
		schema, name = s, n
	}
	cols, err := timeColumns(ctx, q, mysqlColumns, schema, name)
	if err != nil {
		return nil, fmt.Errorf("read the lock table's columns: %w", err)
	}
	return cols, nil
}

// mysqlFormat reports whether cols are this version's (granted_utc and
// expires_utc, DATETIME(6) in UTC), or else whether they are an older
// version's (granted_at and expires_at, in the session's time zone); an
// error for anything else.
func mysqlFormat(cols map[string]string, table string) (current, older bool, err error) {
	switch {
	case cols["granted_utc"] == "datetime(6)" && cols["expires_utc"] == "datetime(6)":
		return true, false, nil
	case cols["granted_utc"] == "" && cols["expires_utc"] == "" &&
		cols["granted_at"] == "datetime(6)" && cols["expires_at"] == "datetime(6)":
		return false, true, nil
	}
	return false, false, fmt.Errorf("%w: table %s: want columns granted_utc and expires_utc of type DATETIME(6) (UTC times), have %v",
		ErrTableFormat, table, cols)
}

// checkMySQLTable accepts a table of this version's and upgrades one of an
// older version's (see upgradeMySQLTable).
func checkMySQLTable(ctx context.Context, db *sql.DB, table string) error {
	cols, err := mysqlTimeColumns(ctx, db, table)
	if err != nil {
		return err
	}
	if current, _, err := mysqlFormat(cols, table); current || err != nil {
		return err
	}
	return upgradeMySQLTable(ctx, db, table)
}

// upgradeMySQLTable renames an older version's time columns (granted_at,
// expires_at: the session's local time) to this version's (granted_utc,
// expires_utc: UTC), under LOCK TABLES … WRITE, if no row may still be held:
// every row is free or expired by more than maxZoneOffset, whatever zone its
// writer used, so no value needs converting. The rename is the new format's
// mark: an older client's statements fail from then on (unknown column)
// rather than mix time zones. A row that may be held makes it refuse with
// ErrTableFormat, leaving the table as it was.
func upgradeMySQLTable(ctx context.Context, db *sql.DB, table string) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("upgrade the lock table %s: %w", table, err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "LOCK TABLES "+table+" WRITE"); err != nil {
		return fmt.Errorf("upgrade the lock table %s: %w", table, err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if _, err := conn.ExecContext(uctx, "UNLOCK TABLES"); err != nil {
			// The session may still hold the table: it must not go back to
			// the pool.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	cols, err := mysqlTimeColumns(ctx, conn, table) // information_schema needs no table lock
	if err != nil {
		return err
	}
	if current, _, err := mysqlFormat(cols, table); current || err != nil {
		return err // upgraded meanwhile, or not a lock table
	}
	hours := int(maxZoneOffset.Hours())
	var key []byte
	var surelyPast string
	err = conn.QueryRowContext(ctx, fmt.Sprintf("SELECT `key`, CAST(expires_at + INTERVAL %d HOUR AS CHAR) FROM %s "+
		"WHERE owner <> '' AND expires_at > UTC_TIMESTAMP(6) - INTERVAL %[1]d HOUR ORDER BY expires_at DESC LIMIT 1", hours, table)).
		Scan(&key, &surelyPast)
	switch {
	case err == nil:
		return fmt.Errorf("%w: table %s has an older dlock's columns (times in the session's time zone) and an older client "+
			"may still hold a row (key %q; surely expired at %s UTC): stop the older clients (closing releases their locks) "+
			"and open again; a row held after that is a crashed holder's: wait, or free it: "+
			"UPDATE %[2]s SET owner = '', label = '', expires_at = '1000-01-01' WHERE owner <> ''",
			ErrTableFormat, table, key, surelyPast)
	case !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("upgrade the lock table %s: %w", table, err)
	}
	if _, err := conn.ExecContext(ctx, "ALTER TABLE "+table+
		" CHANGE granted_at granted_utc DATETIME(6) NOT NULL, CHANGE expires_at expires_utc DATETIME(6) NOT NULL"); err != nil {
		return fmt.Errorf("upgrade the lock table %s: %w", table, err)
	}
	return nil
}
