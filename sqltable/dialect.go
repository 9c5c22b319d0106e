package sqltable

import (
	"context"
	"database/sql"
	"strings"
)

// dialect is the SQL of one database. Times are the server's clock, as
// instants that do not depend on the session's time zone (PostgreSQL's
// timestamptz and clock_timestamp(), the time of the statement rather than
// of its transaction; MySQL's DATETIME in UTC and UTC_TIMESTAMP(6)); TTLs
// are passed in microseconds.
type dialect struct {
	create []string // create the table if missing
	// checkTable refuses (ErrTableFormat), or upgrades, a table that
	// existed before with other time columns.
	checkTable func(ctx context.Context, db *sql.DB, table string) error

	// commitMode reads the commit mode: "off" is refused (see
	// ErrAsyncCommit), with asyncAdvice in the error.
	commitMode, asyncAdvice string

	// acquire: $1 key, $2 owner, $3 label, $4 TTL µs. Returns one row: the
	// new token if granted (else NULL), and the holder's remaining TTL in µs
	// if refused (else NULL). With acquireByInsertID it returns no row: the
	// token is the statement's insert ID (0: refused), and holderLeft ($1
	// key) reads the holder's remaining TTL in µs.
	acquire           string
	acquireByInsertID bool
	holderLeft        string
	// refresh: $1 key, $2 owner, $3 TTL µs. One row affected if extended.
	refresh string
	// release: $1 key, $2 owner. One row affected if freed. The token stays.
	release string
	// relabel: $1 key, $2 owner, $3 label. One row affected if changed.
	// heldBy, where affected rows count only changed rows (MySQL): $1 key,
	// $2 owner; a row if the owner holds the key (a relabel to the label
	// the row has affects none).
	relabel, heldBy string
	// inspect: $1 key; list: $1 a LIKE pattern (escape \). Rows of held locks:
	// key, owner, label, token, grant time in µs since the Unix epoch,
	// remaining TTL in µs.
	inspect, list string

	// refreshArgs and relabelArgs order the arguments of refresh and
	// relabel where placeholders are positional; nil: key, owner, then the
	// TTL or label ($1, $2, $3).
	refreshArgs func(key, owner string, ttlUS int64) []any
	relabelArgs func(key, owner, label string) []any
}

func postgresDialect(table string) *dialect {
	r := strings.NewReplacer("{t}", table)
	const cols = `key, owner, label, token, (extract(epoch FROM granted_at) * 1000000)::bigint, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint`
	return &dialect{
		checkTable: checkPostgresTable,
		create: []string{r.Replace(`CREATE TABLE IF NOT EXISTS {t} (
	key        text PRIMARY KEY,
	owner      text NOT NULL,
	label      text NOT NULL,
	token      bigint NOT NULL,
	granted_at timestamptz NOT NULL,
	expires_at timestamptz NOT NULL
)`)},
		commitMode:  "SELECT current_setting('synchronous_commit')",
		asyncAdvice: "synchronous_commit=off; set it to local or on for the role or the database: ALTER ROLE … SET synchronous_commit = local",
		// The CTE's insert and the main query's read of the table see the
		// same snapshot: when the insert takes nothing, the read is the
		// holder's row as it refused.
		acquire: r.Replace(`WITH g AS (
	INSERT INTO {t} AS l (key, owner, label, token, granted_at, expires_at)
	VALUES ($1, $2, $3, 1, clock_timestamp(), clock_timestamp() + $4::bigint * interval '1 microsecond')
	ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, label = excluded.label, token = l.token + 1,
		granted_at = excluded.granted_at, expires_at = excluded.expires_at
	WHERE l.expires_at <= clock_timestamp()
	RETURNING token
)
SELECT (SELECT token FROM g),
	(SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint FROM {t} WHERE key = $1 AND NOT EXISTS (SELECT FROM g))`),
		refresh: r.Replace(`UPDATE {t} SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()`),
		release: r.Replace(`UPDATE {t} SET owner = '', label = '', expires_at = 'epoch' WHERE key = $1 AND owner = $2 AND owner <> ''`),
		relabel: r.Replace(`UPDATE {t} SET label = $3 WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()`),
		inspect: r.Replace(`SELECT ` + cols + ` FROM {t} WHERE key = $1 AND owner <> '' AND expires_at > clock_timestamp()`),
		list:    r.Replace(`SELECT ` + cols + ` FROM {t} WHERE key LIKE $1 AND owner <> '' AND expires_at > clock_timestamp() ORDER BY key`),
	}
}

// mysqlDialect is MySQL's and MariaDB's. `key` is a reserved word there, and
// keys are compared as bytes (VARBINARY: a case-insensitive collation would
// merge keys dlock keeps apart). Times are UTC (UTC_TIMESTAMP(6), in
// DATETIME(6) columns named *_utc): NOW(6) is the session's local time,
// which differs between sessions in different time zones and repeats an
// hour when a zone with daylight saving time falls back. The acquire is an
// INSERT … ON DUPLICATE KEY UPDATE whose assignments run left to right, each
// seeing the columns the ones before it set: expires_utc, which every
// condition reads, is assigned last. The granted token comes back as the
// statement's insert ID (LAST_INSERT_ID(expr)), 0 when refused; a refused
// attempt then reads the holder's remaining TTL (holderLeft).
func mysqlDialect(table string) *dialect {
	r := strings.NewReplacer("{t}", table)
	const granted = "expires_utc <= UTC_TIMESTAMP(6)"
	const cols = "`key`, owner, label, token, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', granted_utc), TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_utc)"
	return &dialect{
		create: []string{r.Replace("CREATE TABLE IF NOT EXISTS {t} (\n" +
			"\t`key`       VARBINARY(1024) NOT NULL PRIMARY KEY,\n" +
			"\towner       VARBINARY(64) NOT NULL,\n" +
			"\tlabel       VARBINARY(128) NOT NULL,\n" +
			"\ttoken       BIGINT NOT NULL,\n" +
			"\tgranted_utc DATETIME(6) NOT NULL,\n" +
			"\texpires_utc DATETIME(6) NOT NULL\n" +
			") ENGINE=InnoDB")},
		checkTable:        checkMySQLTable,
		commitMode:        "SELECT IF(@@innodb_flush_log_at_trx_commit = 0, 'off', 'on')",
		asyncAdvice:       "innodb_flush_log_at_trx_commit=0; set it to 1 (or 2, which survives a crash of the server but not of its machine)",
		acquireByInsertID: true,
		acquire: r.Replace("INSERT INTO {t} (`key`, owner, label, token, granted_utc, expires_utc)\n" +
			"VALUES (?, ?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)\n" +
			"ON DUPLICATE KEY UPDATE\n" +
			"\ttoken = IF(" + granted + ", LAST_INSERT_ID(token + 1), token + LAST_INSERT_ID(0)),\n" +
			"\towner = IF(" + granted + ", VALUES(owner), owner),\n" +
			"\tlabel = IF(" + granted + ", VALUES(label), label),\n" +
			"\tgranted_utc = IF(" + granted + ", VALUES(granted_utc), granted_utc),\n" +
			"\texpires_utc = IF(" + granted + ", VALUES(expires_utc), expires_utc)"),
		holderLeft: r.Replace("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_utc) FROM {t} WHERE `key` = ?"),
		refresh:    r.Replace("UPDATE {t} SET expires_utc = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE `key` = ? AND owner = ? AND expires_utc > UTC_TIMESTAMP(6)"),
		release:    r.Replace("UPDATE {t} SET owner = '', label = '', expires_utc = '1000-01-01' WHERE `key` = ? AND owner = ? AND owner <> ''"),
		relabel:    r.Replace("UPDATE {t} SET label = ? WHERE `key` = ? AND owner = ? AND expires_utc > UTC_TIMESTAMP(6)"),
		heldBy:     r.Replace("SELECT 1 FROM {t} WHERE `key` = ? AND owner = ? AND expires_utc > UTC_TIMESTAMP(6)"),
		inspect:    r.Replace("SELECT " + cols + " FROM {t} WHERE `key` = ? AND owner <> '' AND expires_utc > UTC_TIMESTAMP(6)"),
		list:       r.Replace("SELECT " + cols + " FROM {t} WHERE `key` LIKE ? AND owner <> '' AND expires_utc > UTC_TIMESTAMP(6) ORDER BY `key`"),
		// MySQL's placeholders are positional: the arguments in statement
		// order.
		refreshArgs: func(key, owner string, ttlUS int64) []any { return []any{ttlUS, key, owner} },
		relabelArgs: func(key, owner, label string) []any { return []any{label, key, owner} },
	}
}
