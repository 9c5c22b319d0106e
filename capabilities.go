package dlock

import "github.com/dlock-go/dlock/backend"

// Capabilities are a backend's guarantees, each proved by the conformance suite.
type Capabilities = backend.Capabilities

// FencingLevel says how far a backend's tokens can be trusted.
type FencingLevel = backend.FencingLevel

// The fencing levels, from weakest to strongest.
const (
	// FencingNone: the backend gives no usable token.
	FencingNone = backend.FencingNone

	// FencingTimingDependent: tokens increase while the backend's timing
	// assumptions hold (bounded clock drift, no restart that loses data): Redlock.
	FencingTimingDependent = backend.FencingTimingDependent

	// FencingStrict: tokens strictly increase per key across every grant,
	// whatever the timing, for all failures the backend's durability survives.
	FencingStrict = backend.FencingStrict
)

// TimeAuthority says whose clock decides that a lease has expired.
type TimeAuthority = backend.TimeAuthority

// The time authorities.
const (
	// TimeServer: the server expires the lock on its own clock (Redis PX, an
	// etcd lease, a ZooKeeper session, a PostgreSQL session timeout).
	TimeServer = backend.TimeServer

	// TimeClient: the client's clock decides validity, and correctness depends
	// on bounded drift between client and servers (Redlock).
	TimeClient = backend.TimeClient
)
