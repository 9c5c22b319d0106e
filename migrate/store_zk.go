package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/zookeeper"
)

// zkStore keeps the records in ZooKeeper, next to the new backend's locks but
// outside their tree: under "<root>.migrate/", not "<root>/". It uses a
// session of its own, opened by the zookeeper driver from the same DSN.
type zkStore struct {
	drv  *zookeeper.Driver
	conn *zk.Conn
	root string
	acl  []zk.ACL
}

func openZKStore(ctx context.Context, to *url.URL) (store, error) {
	open, ok := backend.Lookup("zk")
	if !ok {
		return nil, errors.New("new backend: the zk scheme is not registered")
	}
	d, err := open(ctx, backend.WithoutPortable(to))
	if err != nil {
		return nil, fmt.Errorf("new backend: %w", backend.RedactError(err, to))
	}
	zd, ok := d.(*zookeeper.Driver)
	if !ok {
		_ = d.Close()
		return nil, fmt.Errorf("new backend: the zk scheme opened a %T, not the zookeeper driver", d)
	}
	s := &zkStore{drv: zd, conn: zd.Conn(), root: zd.Root() + ".migrate", acl: zk.WorldACL(zk.PermAll)}
	if to.User != nil {
		// Digest authentication: the records are the authenticated user's only.
		s.acl = zk.AuthACL(zk.PermAll)
	}
	if err := s.ensure(s.root + "/base"); err != nil {
		_ = zd.Close()
		return nil, fmt.Errorf("new backend: create %s: %w", s.root, err)
	}
	return s, nil
}

// ensure creates path and its missing parents as persistent nodes.
func (s *zkStore) ensure(path string) error {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	p := ""
	for _, part := range parts {
		p += "/" + part
		if _, err := s.conn.Create(p, nil, 0, s.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

func (s *zkStore) switchPath() string         { return s.root + "/switch" }
func (s *zkStore) basePath(key string) string { return zookeeper.LockPath(s.root+"/base", key) }

// get reads path after a sync, so the read sees every write that completed
// before it (ZooKeeper reads are otherwise served by a possibly lagging
// server). version is the node's version + 1, 0 if there is none.
func (s *zkStore) get(ctx context.Context, path string, synced bool) (data []byte, version int64, err error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if !synced {
		if _, err := s.conn.Sync(s.root); err != nil {
			return nil, 0, err
		}
	}
	data, st, err := s.conn.Get(path)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil, 0, nil
	case err != nil:
		return nil, 0, err
	}
	return data, int64(st.Version) + 1, nil
}

func (s *zkStore) read(ctx context.Context, key string) (state, error) {
	data, v, err := s.get(ctx, s.switchPath(), false)
	if err != nil {
		return state{}, fmt.Errorf("read the switch record: %w", err)
	}
	var st state
	if v != 0 {
		if st.rec, err = decodeRecord(data); err != nil {
			return state{}, err
		}
	}
	data, v, err = s.get(ctx, s.basePath(key), true)
	if err != nil {
		return state{}, fmt.Errorf("read the base of key %q: %w", key, err)
	}
	if v != 0 {
		b, err := strconv.ParseUint(string(data), 10, 64)
		if err != nil {
			return state{}, fmt.Errorf("%w: base of key %q is %q, not a number", ErrMismatch, key, data)
		}
		st.base, st.baseRev = b, v
	}
	return st, nil
}

func (s *zkStore) readSwitch(ctx context.Context) (*Record, error) {
	data, v, err := s.get(ctx, s.switchPath(), false)
	if err != nil {
		return nil, fmt.Errorf("read the switch record: %w", err)
	}
	if v == 0 {
		return nil, ErrNotSwitched
	}
	return decodeRecord(data)
}

func (s *zkStore) setBase(ctx context.Context, key string, base uint64, rev int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data := []byte(strconv.FormatUint(base, 10))
	var err error
	if rev == 0 {
		_, err = s.conn.Create(s.basePath(key), data, 0, s.acl)
	} else {
		_, err = s.conn.Set(s.basePath(key), data, int32(rev-1))
	}
	switch {
	case errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode):
		return fmt.Errorf("%w: the base of key %q changed while this client held both locks", ErrTokenBackwards, key)
	case err != nil:
		return fmt.Errorf("record the base of key %q: %w", key, err)
	}
	return nil
}

func (s *zkStore) createSwitch(ctx context.Context, rec *Record) (*Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, false, err
	}
	_, err = s.conn.Create(s.switchPath(), data, 0, s.acl)
	switch {
	case err == nil:
		return rec, true, nil
	case !errors.Is(err, zk.ErrNodeExists):
		return nil, false, fmt.Errorf("write the switch record: %w", err)
	}
	cur, err := s.readSwitch(ctx)
	return cur, false, err
}

func (s *zkStore) close() error { return s.drv.Close() }
