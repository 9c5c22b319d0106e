package zookeeper_test

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/zookeeper"
)

// Passwords distinctive enough to be found in any message that leaks them.
const (
	uPass = "u-Pw-5c1e9a"
	vPass = "v-Pw-27d4b0"
)

// aclClient is one client of a shared ZooKeeper: a Locker and a raw
// connection with the same credentials (none for the anonymous one).
type aclClient struct {
	name   string
	locker dlock.Locker
	conn   *zk.Conn
}

func newACLClient(t *testing.T, srv *testenv.ZooKeeper, name, user, pass, path string) aclClient {
	t.Helper()
	userinfo := ""
	if user != "" {
		userinfo = user + ":" + pass + "@"
	}
	l, err := dlock.Open(testCtx(t), "zk://"+userinfo+srv.Addr()+path)
	if err != nil {
		t.Fatalf("Open as %s: %v", name, err)
	}
	t.Cleanup(func() { l.Close() })
	conn, _, err := zk.Connect([]string{srv.Addr()}, 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if user != "" {
		if err := conn.AddAuth("digest", []byte(user+":"+pass)); err != nil {
			t.Fatal(err)
		}
	}
	return aclClient{name: name, locker: l, conn: conn}
}

// checkRefusal checks that err is ZooKeeper's refusal, matched by errors.Is,
// naming node and an entry of its ACL (want), and that it shows neither a
// password nor u's digest hash.
func checkRefusal(t *testing.T, what string, err error, node, want string) {
	t.Helper()
	if !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("%s: %v, want an error matching zk.ErrNoAuth", what, err)
	}
	msg := err.Error()
	if !strings.Contains(msg, node) || !strings.Contains(msg, want) {
		t.Errorf("%s: %q; want it to name %s and its ACL (%s)", what, msg, node, want)
	}
	hash := strings.TrimPrefix(zk.DigestACL(zk.PermAll, "u", uPass)[0].ID, "u:")
	for _, secret := range []string{uPass, vPass, hash} {
		if strings.Contains(msg, secret) {
			t.Errorf("%s: %q shows a secret", what, msg)
		}
	}
}

// TestSharedRootACL: a client with digest credentials locks first on the
// default root; an anonymous client and a client of another user then lock
// keys of their own there, list the root, and can neither queue for, break,
// delete, rewrite nor re-ACL the first client's lock. ZooKeeper checks a
// delete against the parent's ACL, so it is the key's node, which the first
// client created, that protects its lock node.
func TestSharedRootACL(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	ctx := testCtx(t)
	u := newACLClient(t, srv, "user u", "u", uPass, "")
	const uKey = "jobs/u"
	uLease := mustAcquire(t, u.locker, uKey)
	keyNode := zookeeper.LockPath(zookeeper.DefaultRoot, uKey)
	children, _, err := u.conn.Children(keyNode)
	if err != nil || len(children) != 1 {
		t.Fatalf("children of %s: %q, %v", keyNode, children, err)
	}
	uNode := keyNode + "/" + children[0]

	v := newACLClient(t, srv, "user v", "v", vPass, "")
	for _, c := range []aclClient{newACLClient(t, srv, "anonymous", "", "", ""), v} {
		t.Run(c.name, func(t *testing.T) {
			own := strings.ReplaceAll(c.name, " ", "-") + "/own"
			lease, err := c.locker.TryAcquire(ctx, own)
			if err != nil {
				t.Fatalf("TryAcquire(%q), a key of its own: %v", own, err)
			}
			infos, err := dlock.List(ctx, c.locker, "")
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			keys := make([]string, 0, len(infos))
			for _, in := range infos {
				keys = append(keys, in.Key)
			}
			if !slices.Contains(keys, uKey) || !slices.Contains(keys, own) {
				t.Errorf("List: %q, want %q and %q among them", keys, uKey, own)
			}
			mustRelease(t, lease)

			_, err = c.locker.TryAcquire(ctx, uKey)
			checkRefusal(t, "TryAcquire of u's key", err, keyNode, "digest:u:cdrwa")
			_, err = c.locker.Acquire(ctx, uKey)
			checkRefusal(t, "Acquire of u's key", err, keyNode, "digest:u:cdrwa")
			_, err = dlock.Break(ctx, c.locker, uKey)
			checkRefusal(t, "Break of u's key", err, keyNode, "digest:u:cdrwa")

			for what, err := range map[string]error{
				"delete":             c.conn.Delete(uNode, -1),
				"set data":           second(c.conn.Set(uNode, []byte("mine"), -1)),
				"set ACL":            second(c.conn.SetACL(uNode, zk.WorldACL(zk.PermAll), -1)),
				"set the key's ACL":  second(c.conn.SetACL(keyNode, zk.WorldACL(zk.PermAll), -1)),
				"create a lock node": second(c.conn.Create(keyNode+"/_c_x-lock-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))),
			} {
				if !errors.Is(err, zk.ErrNoAuth) {
					t.Errorf("%s of u's lock: %v, want zk.ErrNoAuth", what, err)
				}
			}
		})
	}

	if err := uLease.Err(); err != nil {
		t.Fatalf("u's lease: %v", err)
	}
	if ok, _, err := u.conn.Exists(uNode); err != nil || !ok {
		t.Fatalf("u's lock node: exists=%v, %v", ok, err)
	}
	if err := uLease.Refresh(ctx); err != nil {
		t.Fatalf("u's renewal: %v", err)
	}

	// The root is open; the key's node and the lock node are u's, readable
	// by anyone.
	wantACL := map[string][]zk.ACL{
		zookeeper.DefaultRoot: zk.WorldACL(zk.PermAll),
		keyNode:               {zk.DigestACL(zk.PermAll, "u", uPass)[0], {Perms: zk.PermRead, Scheme: "world", ID: "anyone"}},
	}
	wantACL[uNode] = wantACL[keyNode]
	for node, want := range wantACL {
		acl, _, err := u.conn.GetACL(node)
		if err != nil || !slices.Equal(acl, want) {
			t.Errorf("ACL of %s: %+v, %v; want %+v", node, acl, err, want)
		}
	}
	mustRelease(t, uLease)

	// The key's node stays u's, and v is refused, until the server deletes
	// it, an empty container (checked every minute by default); u's delete
	// stands in for the server's. Then v makes it again, as v's, and u is
	// refused.
	_, err = v.locker.TryAcquire(ctx, uKey)
	checkRefusal(t, "v's TryAcquire of the key u released", err, keyNode, "digest:u:cdrwa")
	if err := u.conn.Delete(keyNode, -1); err != nil {
		t.Fatalf("delete the empty %s: %v", keyNode, err)
	}
	vLease, err := v.locker.TryAcquire(ctx, uKey)
	if err != nil {
		t.Fatalf("v's TryAcquire of the key u released: %v", err)
	}
	_, err = u.locker.TryAcquire(ctx, uKey)
	checkRefusal(t, "u's TryAcquire of the key v holds", err, keyNode, "digest:v:cdrwa")
	mustRelease(t, vLease)
}

// TestACLParameters: the DSN parameters acl (key and lock nodes) and rootacl
// (the root) set the ACLs the driver creates nodes with; a malformed one is
// refused at Open, naming the entry but not its text.
func TestACLParameters(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	ctx := testCtx(t)

	// An ACL the DSN names is used as it is. With open key nodes, v queues
	// for u's key like any other waiter, and is granted it in turn.
	const open = "?acl=world:anyone:cdrwa"
	u := newACLClient(t, srv, "user u", "u", uPass, "/open"+open)
	v := newACLClient(t, srv, "user v", "v", vPass, "/open"+open)
	lease := mustAcquire(t, u.locker, "k")
	mustTryFail(t, v.locker, "k", "v's TryAcquire of the key u holds")
	mustRelease(t, lease)
	lease = mustAcquire(t, v.locker, "k")
	// The price of open key nodes: ZooKeeper checks a delete against the
	// parent's ACL, so anyone can delete the key's lock nodes.
	children, _, err := u.conn.Children("/open/k")
	if err != nil || len(children) != 1 {
		t.Fatalf("children of /open/k: %q, %v", children, err)
	}
	if err := u.conn.Delete("/open/k/"+children[0], -1); err != nil {
		t.Fatalf("u's delete of v's lock node under an open key node: %v", err)
	}
	waitDone(t, lease, 10*time.Second, "v's lease after u deleted its node")

	// rootacl: the root is u's (and readable by anyone), so the anonymous
	// client cannot make keys under it.
	rootACL := "digest:" + zk.DigestACL(zk.PermAll, "u", uPass)[0].ID + ":cdrwa,world:anyone:r"
	u = newACLClient(t, srv, "user u", "u", uPass, "/private?rootacl="+url.QueryEscape(rootACL))
	lease = mustAcquire(t, u.locker, "k")
	anon := newACLClient(t, srv, "anonymous", "", "", "/private")
	_, err = anon.locker.TryAcquire(ctx, "j")
	checkRefusal(t, "anonymous TryAcquire under u's root", err, "/private", "digest:u:cdrwa,world:anyone:r")
	if !strings.Contains(err.Error(), "this client is anonymous") {
		t.Errorf("refusal %q does not say the client is anonymous", err)
	}
	mustRelease(t, lease)

	for _, tc := range []struct{ query, want string }{
		{"acl=", "empty ACL"},
		{"acl=world:anyone", "ACL entry 1: want scheme:id:perms"},
		{"acl=world:anyone:cdrwa,digest:u:" + uPass + ":cdrwa", "ACL entry 2: a digest id"},
		{"rootacl=world:anyone:rx", "letters of cdrwa"},
		{"rootacl=world:nobody:r", "only id is anyone"},
		{"acl=digest:u:ab+cd:r", "space"},
	} {
		l, err := dlock.Open(ctx, "zk://"+srv.Addr()+"/bad?"+tc.query)
		if err == nil {
			l.Close()
			t.Errorf("Open with %s succeeded", tc.query)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open with %s: %v; want ErrInvalidOption saying %q", tc.query, err, tc.want)
		}
		if strings.Contains(err.Error(), uPass) || strings.Contains(err.Error(), "nobody") {
			t.Errorf("Open with %s: %v repeats the value", tc.query, err)
		}
	}
}

// second returns the error of a two-result call.
func second[T any](_ T, err error) error { return err }
