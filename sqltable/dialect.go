package sqltable

import "strings"

// dialect is the SQL of one database. Times are the server's clock
// (clock_timestamp(): the time of the statement, not of its transaction);
// TTLs are passed in microseconds.
type dialect struct {
	create []string // create the table if missing

	// commitMode reads the commit mode: "off" is refused (see ErrAsyncCommit).
	commitMode string

	// acquire: $1 key, $2 owner, $3 label, $4 TTL µs. Returns one row: the
	// new token if granted (else NULL), and the holder's remaining TTL in µs
	// if refused (else NULL).
	acquire string
	// refresh: $1 key, $2 owner, $3 TTL µs. One row affected if extended.
	refresh string
	// release: $1 key, $2 owner. One row affected if freed. The token stays.
	release string
	// relabel: $1 key, $2 owner, $3 label. One row affected if changed.
	relabel string
	// inspect: $1 key; list: $1 a LIKE pattern (escape \). Rows of held locks:
	// key, owner, label, token, granted_at, remaining TTL in µs.
	inspect, list string
}

func postgresDialect(table string) *dialect {
	r := strings.NewReplacer("{t}", table)
	const cols = `key, owner, label, token, granted_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint`
	return &dialect{
		create: []string{r.Replace(`CREATE TABLE IF NOT EXISTS {t} (
	key        text PRIMARY KEY,
	owner      text NOT NULL,
	label      text NOT NULL,
	token      bigint NOT NULL,
	granted_at timestamptz NOT NULL,
	expires_at timestamptz NOT NULL
)`)},
		commitMode: "SELECT current_setting('synchronous_commit')",
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
