// Package nats is dlock's driver for NATS JetStream key-value buckets,
// through github.com/nats-io/nats.go. Importing it registers the DSN scheme
// "nats" with dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/nats"
//
//	locker, err := dlock.Open(ctx, "nats://10.0.0.1:4222,10.0.0.2:4222/locks?replicas=3")
//
// To use a *nats.Conn built in code, call [New] or [NewDriver].
//
// A lock is a key of the bucket ([KeyName]), taken with the key-value
// store's create-only write and a per-message TTL (nats-server 2.11 or
// later), renewed with a write conditional on the key's last revision, and
// released with a purge conditional on it. The fencing token is the stream
// sequence of the granting create, strictly increasing per key
// ([backend.FencingStrict]). Each driver watches its bucket through one
// consumer, which wakes its waiters when their key is deleted (they are not
// served in order) and tells a holder at once that its key was deleted or
// taken.
//
// DSN: nats://[user:password@]host[:port][,host[:port]...][/bucket], with the
// parameters replicas (of a bucket the driver creates; 1), request-timeout
// and dial-timeout (5s each) and poll (5s). docs/nats.md has the whole
// write-up: layout, token, guarantees, the DSN in detail.
package nats
