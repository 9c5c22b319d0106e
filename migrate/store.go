package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/etcd"
)

// RecordVersion is the format version of the switch record this package
// writes and reads.
const RecordVersion = 1

// Record is the switch record, written once as JSON in the new backend under
// "<prefix>.migrate/switch", outside the locks' key range.
type Record struct {
	// Version is the record's format (RecordVersion).
	Version int `json:"version"`

	// From is the old backend (see BackendID).
	From string `json:"from"`

	// Base is the least base of every key's mapped tokens: above every token
	// the old backend had given when the switch was recorded.
	Base uint64 `json:"base"`

	// At is when the switch was recorded (the operator's clock; informative).
	At time.Time `json:"at"`
}

// check reports whether r is a record this Locker can use, for an old
// backend with id from ("" skips that check).
func (r *Record) check(from string) error {
	if r.Version != RecordVersion {
		return fmt.Errorf("%w: record version %d, this dlock reads %d", ErrMismatch, r.Version, RecordVersion)
	}
	if r.Base == 0 {
		return fmt.Errorf("%w: record has no base", ErrMismatch)
	}
	if from != "" && r.From != from {
		return fmt.Errorf("%w: it is for the old backend %s, this client's is %s", ErrMismatch, r.From, from)
	}
	return nil
}

// store keeps the switch record and the per-key bases in the new backend.
type store interface {
	// read returns the switch record and key's base, in one linearizable read.
	read(ctx context.Context, key string) (state, error)
	// readSwitch returns the switch record, or an error matching ErrNotSwitched.
	readSwitch(ctx context.Context) (*Record, error)
	// setBase records base for key if key's base is still at version rev (as
	// read; 0: none), else fails with ErrTokenBackwards.
	setBase(ctx context.Context, key string, base uint64, rev int64) error
	// createSwitch writes rec unless a record exists; it returns the record
	// in the store afterwards and whether it was rec.
	createSwitch(ctx context.Context, rec *Record) (*Record, bool, error)
	close() error
}

// etcdStore keeps the records in etcd, next to the new backend's locks but
// outside their key range: under "<prefix>.migrate/", not "<prefix>/".
type etcdStore struct {
	cli  *clientv3.Client
	root string
}

// state is what a grant reads from the store in one linearizable request.
type state struct {
	rec     *Record // nil before the switch
	base    uint64  // key's recorded base; 0 if none
	baseRev int64   // version of key's base, for setBase; 0 if none
}

// openStore connects to the new backend of the DSN to.
func openStore(ctx context.Context, to *url.URL) (store, error) {
	switch to.Scheme {
	case "etcd", "etcds":
		cli, prefix, err := etcd.Dial(ctx, to.String())
		if err != nil {
			return nil, fmt.Errorf("new backend: %w", backend.RedactError(err, to))
		}
		return &etcdStore{cli: cli, root: prefix + ".migrate"}, nil
	case "zk":
		return openZKStore(ctx, to)
	}
	return nil, fmt.Errorf("%w: the new backend must be etcd (etcd://, etcds://) or ZooKeeper (zk://), not %s://", dlock.ErrInvalidOption, to.Scheme)
}

func (s *etcdStore) switchKey() string         { return s.root + "/switch" }
func (s *etcdStore) baseKey(key string) string { return etcd.LockName(s.root+"/base", key) }

func (s *etcdStore) read(ctx context.Context, key string) (state, error) {
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.switchKey()), clientv3.OpGet(s.baseKey(key))).Commit()
	if err != nil {
		return state{}, fmt.Errorf("read the switch record: %w", err)
	}
	var st state
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if st.rec, err = decodeRecord(kvs[0].Value); err != nil {
			return state{}, err
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		b, err := strconv.ParseUint(string(kvs[0].Value), 10, 64)
		if err != nil {
			return state{}, fmt.Errorf("%w: base of key %q is %q, not a number", ErrMismatch, key, kvs[0].Value)
		}
		st.base, st.baseRev = b, kvs[0].ModRevision
	}
	return st, nil
}

func (s *etcdStore) readSwitch(ctx context.Context) (*Record, error) {
	resp, err := s.cli.Get(ctx, s.switchKey())
	if err != nil {
		return nil, fmt.Errorf("read the switch record: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, ErrNotSwitched
	}
	return decodeRecord(resp.Kvs[0].Value)
}

func (s *etcdStore) setBase(ctx context.Context, key string, base uint64, rev int64) error {
	k := s.baseKey(key)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
		Then(clientv3.OpPut(k, strconv.FormatUint(base, 10))).
		Commit()
	if err != nil {
		return fmt.Errorf("record the base of key %q: %w", key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: the base of key %q changed while this client held both locks", ErrTokenBackwards, key)
	}
	return nil
}

func (s *etcdStore) createSwitch(ctx context.Context, rec *Record) (*Record, bool, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, false, err
	}
	k := s.switchKey()
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(data))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return nil, false, fmt.Errorf("write the switch record: %w", err)
	}
	if resp.Succeeded {
		return rec, true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, false, errors.New("write the switch record: it exists but could not be read")
	}
	cur, err := decodeRecord(kvs[0].Value)
	return cur, false, err
}

func (s *etcdStore) close() error { return s.cli.Close() }

func decodeRecord(data []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: switch record is not valid JSON: %w", ErrMismatch, err)
	}
	return &r, nil
}
