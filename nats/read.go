package nats

import (
	"context"
	"encoding/json"
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

// errNoMessage is the server's error code for a subject without a message.
const errNoMessage = 10037

// readKey reads the last message of the bucket key name from the stream's
// leader. nats.go's KeyValue.Get asks for a direct read, which any replica
// may answer, from a state that may lag behind the writes it was told of: a
// read that decides a lease's fate must not go back in time. It fails with
// jetstream.ErrKeyNotFound when the key has no message.
func (d *Driver) readKey(ctx context.Context, name string) (entry, error) {
	req, _ := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{d.subject + name})
	m, err := d.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+d.bucket, req)
	if err != nil {
		return entry{}, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Sequence uint64 `json:"seq"`
			Header   []byte `json:"hdrs"`
			Data     []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return entry{}, fmt.Errorf("read %s: %w", name, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == errNoMessage:
		return entry{}, jetstream.ErrKeyNotFound
	case resp.Error != nil:
		return entry{}, resp.Error
	case resp.Message == nil:
		return entry{}, fmt.Errorf("read %s: %w", name, jetstream.ErrInvalidJetStreamResponse)
	}
	e := entry{rev: resp.Message.Sequence, op: jetstream.KeyValuePut, value: resp.Message.Data}
	if len(resp.Message.Header) > 0 {
		h, err := natsgo.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return entry{}, fmt.Errorf("read %s: %w", name, err)
		}
		switch {
		case h.Get("KV-Operation") == "DEL", h.Get(jetstream.MarkerReasonHeader) == "Remove":
			e.op = jetstream.KeyValueDelete
		case h.Get("KV-Operation") == "PURGE", h.Get(jetstream.MarkerReasonHeader) != "":
			e.op = jetstream.KeyValuePurge
		}
	}
	return e, nil
}
