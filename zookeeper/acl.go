// The ACLs of the nodes the driver creates, and the errors of a refusal.

package zookeeper

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/dlock-go/dlock/third_party/zk"
)

// readByAnyone lets every client list a key's lock nodes and read their
// labels (dlock ls, Inspect, Watch), and nothing more.
var readByAnyone = zk.ACL{Perms: zk.PermRead, Scheme: "world", ID: "anyone"}

// defaultACL is Options.ACL's default: with credentials, all permissions for
// their identity and read for anyone; without, open.
func defaultACL(digest bool) []zk.ACL {
	if digest {
		return append(zk.AuthACL(zk.PermAll), readByAnyone)
	}
	return zk.WorldACL(zk.PermAll)
}

// permLetters are the letters of the permissions in permBits, in the order
// of ZooKeeper's command line (getAcl, setAcl).
const permLetters = "cdrwa"

var permBits = [len(permLetters)]int32{zk.PermCreate, zk.PermDelete, zk.PermRead, zk.PermWrite, zk.PermAdmin}

// parseACL reads an ACL written as ZooKeeper's command line writes one:
// comma-separated scheme:id:perms entries, such as
// "digest:app:HASH:cdrwa,world:anyone:r", where HASH is
// base64(sha1("app:password")) (zk.DigestACL computes it). Its errors name
// the entry by its number, never by its text.
func parseACL(s string) ([]zk.ACL, error) {
	if s == "" {
		return nil, errors.New("empty ACL (want scheme:id:perms[,...], such as world:anyone:cdrwa)")
	}
	var acl []zk.ACL
	for i, e := range strings.Split(s, ",") {
		scheme, rest, ok := strings.Cut(e, ":")
		j := strings.LastIndexByte(rest, ':')
		if !ok || j < 0 || scheme == "" {
			return nil, fmt.Errorf("ACL entry %d: want scheme:id:perms, such as world:anyone:cdrwa", i+1)
		}
		id, letters := rest[:j], rest[j+1:]
		if strings.ContainsAny(id, " \t") {
			return nil, fmt.Errorf("ACL entry %d: its id has a space (a '+' in a DSN query reads as a space: write it %%2B)", i+1)
		}
		var perms int32
		for k := range len(letters) {
			n := strings.IndexByte(permLetters, letters[k])
			if n < 0 || perms&permBits[n] != 0 {
				return nil, fmt.Errorf("ACL entry %d: permissions are letters of cdrwa, each at most once", i+1)
			}
			perms |= permBits[n]
		}
		if perms == 0 {
			return nil, fmt.Errorf("ACL entry %d: no permission (want letters of cdrwa)", i+1)
		}
		switch scheme {
		case "world":
			if id != "anyone" {
				return nil, fmt.Errorf("ACL entry %d: the world scheme's only id is anyone", i+1)
			}
		case "auth":
			if id != "" {
				return nil, fmt.Errorf("ACL entry %d: the auth scheme takes an empty id (auth::perms)", i+1)
			}
		case "digest":
			// A password written where the hash goes would be stored,
			// and shown by getAcl: refuse anything but a hash.
			user, hash, _ := strings.Cut(id, ":")
			if b, err := base64.StdEncoding.DecodeString(hash); user == "" || err != nil || len(b) != 20 {
				return nil, fmt.Errorf("ACL entry %d: a digest id is user:base64(sha1(user:password)), not a password (zk.DigestACL computes it)", i+1)
			}
		}
		acl = append(acl, zk.ACL{Perms: perms, Scheme: scheme, ID: id})
	}
	return acl, nil
}

// formatACL writes acl as ZooKeeper's command line does, but a digest id as
// its user name alone: "digest:app:cdrwa,world:anyone:r".
func formatACL(acl []zk.ACL) string {
	var b strings.Builder
	for i, a := range acl {
		if i > 0 {
			b.WriteByte(',')
		}
		id := a.ID
		if a.Scheme == "digest" {
			id, _, _ = strings.Cut(id, ":")
		}
		b.WriteString(a.Scheme + ":" + id + ":")
		for n, bit := range permBits {
			if a.Perms&bit != 0 {
				b.WriteByte(permLetters[n])
			}
		}
	}
	return b.String()
}

// refused returns err, if it is ZooKeeper's refusal (zk.ErrNoAuth), with the
// ACL of node, the node whose ACL refused it, and the identity of the
// driver's client in its message; errors.Is still matches zk.ErrNoAuth.
// Other errors are returned as they are. It never shows a password or a
// digest's hash.
func (d *Driver) refused(err error, node string) error {
	if !errors.Is(err, zk.ErrNoAuth) {
		return err
	}
	acl, _, aerr := d.conn.GetACL(node)
	what := "has ACL " + formatACL(acl)
	if aerr != nil {
		what = fmt.Sprintf("has an ACL this client cannot read (%v)", aerr)
	}
	if d.identity == "" {
		return fmt.Errorf("%w: %s %s", err, node, what)
	}
	return fmt.Errorf("%w: %s %s, and this client is %s", err, node, what, d.identity)
}

// parentOf returns the path of node's parent.
func parentOf(node string) string {
	if i := strings.LastIndexByte(node, '/'); i > 0 {
		return node[:i]
	}
	return "/"
}
