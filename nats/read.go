package nats

import (
	"context"
	"errors"
	"fmt"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// entry is a key's last message, read by readKey.
type entry struct {
	rev   uint64
	op    jetstream.KeyValueOp
	value []byte
}

// readKey reads the last message of the bucket key name from the stream's
// leader. nats.go's KeyValue.Get asks for a direct read, which any replica
// may answer, from a state that may lag behind the writes it was told of: a
// read that decides a lease's fate must not go back in time. It fails with
// jetstream.ErrKeyNotFound when the key has no message.
func (d *Driver) readKey(ctx context.Context, name string) (entry, error) {
	// The older JetStream API reads through the stream's leader unless
	// asked for a direct read.
	m, err := d.legacy.GetLastMsg("KV_"+d.bucket, d.subject+name, natsgo.Context(ctx))
	switch {
	case errors.Is(err, natsgo.ErrMsgNotFound):
		return entry{}, jetstream.ErrKeyNotFound
	case err != nil:
		return entry{}, fmt.Errorf("read %s: %w", name, err)
	}
	e := entry{rev: m.Sequence, op: jetstream.KeyValuePut, value: m.Data}
	switch {
	case m.Header.Get("KV-Operation") == "DEL", m.Header.Get(jetstream.MarkerReasonHeader) == "Remove":
		e.op = jetstream.KeyValueDelete
	case m.Header.Get("KV-Operation") == "PURGE", m.Header.Get(jetstream.MarkerReasonHeader) != "":
		e.op = jetstream.KeyValuePurge
	}
	return e, nil
}
