package dlock

import "github.com/dlock-go/dlock/backend"

// Capabilities are a backend's guarantees, as Locker.Capabilities reports
// them: what its tokens mean (Fencing), whether waiters are served in order
// (FIFO), whether it survives the loss of a minority of servers, whose clock
// expires a lease, whether waiting is push-based and whether loss is reported
// as it happens. The conformance suite proves every capability a driver
// claims. It is the type drivers fill in (backend.Capabilities); applications
// need not import package backend to read it.
type Capabilities = backend.Capabilities

// FencingLevel says how far a backend's tokens can be trusted; see
// Capabilities.Fencing.
type FencingLevel = backend.FencingLevel

// The fencing levels, from weakest to strongest.
const (
	// FencingNone: the backend gives no usable token.
	FencingNone = backend.FencingNone

	// FencingTimingDependent: tokens increase as long as the backend's timing
	// assumptions hold (bounded clock drift, no restart without persistence
	// within a TTL). Redlock is the example.
	FencingTimingDependent = backend.FencingTimingDependent

	// FencingStrict: tokens strictly increase per key across every grant,
	// whatever the timing, for all failures the backend's durability survives.
	FencingStrict = backend.FencingStrict
)

// TimeAuthority says whose clock decides that a lease has expired; see
// Capabilities.TimeAuthority.
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
