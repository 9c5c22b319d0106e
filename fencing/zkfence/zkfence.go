// Package zkfence fences writes to ZooKeeper by dlock's tokens. A write is
// one multi: its first operation sets the resource's fence node to the token
// on condition that the node still has the version read (or creates it,
// on condition that it does not exist), and the caller's operations follow.
// ZooKeeper applies a multi all or nothing, so if another writer advanced
// the fence after it was read, nothing is written and the guard reads and
// compares again. Like fencing.Guard, a token equal to or above the fence is
// accepted and a lower one, or 0, is rejected with a *fencing.StaleTokenError.
// docs/guards.md has the pattern.
package zkfence

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/third_party/zk"
)

// DefaultRoot is Guard.Root's default.
const DefaultRoot = "/dlock-fences"

// Guard runs fenced multis on ZooKeeper. It holds no state and is safe for
// concurrent use; Conn is required.
type Guard struct {
	// Conn runs the requests. Required.
	Conn *zk.Conn

	// Root is the parent of the fence nodes: resource R's fence is the
	// persistent node Root/R, holding the highest token accepted in decimal.
	// Default DefaultRoot.
	Root string

	// ACL is given to the fence nodes and the parents the guard creates.
	// Default zk.WorldACL(zk.PermAll).
	ACL []zk.ACL

	// OnReject, if set, is called with every rejection of a stale token:
	// count it (package dlockotel's RejectionCounter) or log it. It must not
	// block.
	OnReject func(*fencing.StaleTokenError)
}

// FencePath returns resource's fence node.
func (g *Guard) FencePath(resource string) string {
	root := g.Root
	if root == "" {
		root = DefaultRoot
	}
	return path.Join(root, resource)
}

func (g *Guard) acl() []zk.ACL {
	if g.ACL == nil {
		return zk.WorldACL(zk.PermAll)
	}
	return g.ACL
}

// Multi runs ops (*zk.CreateRequest, *zk.SetDataRequest, *zk.DeleteRequest,
// *zk.CheckVersionRequest) if token is current for resource, in one multi
// with the fence's update, and returns their responses. A stale token fails
// with a *fencing.StaleTokenError and runs nothing; a failing op of the
// caller's fails the whole multi (errors.Is matches its zk error). ops must
// not touch the fence node. ctx bounds the retries after a concurrent
// writer advanced the fence, not a single request.
func (g *Guard) Multi(ctx context.Context, token dlock.Token, resource string, ops ...any) ([]zk.MultiResponse, error) {
	if g.Conn == nil {
		return nil, errors.New("zkfence: Guard.Conn is nil")
	}
	if token == 0 {
		return nil, g.reject(&fencing.StaleTokenError{Resource: resource, Token: token})
	}
	if resource == "" || strings.HasPrefix(resource, "/") || strings.HasSuffix(resource, "/") || strings.Contains(resource, "//") {
		return nil, fmt.Errorf("zkfence: resource %q: want a relative path without empty elements", resource)
	}
	fp, enc := g.FencePath(resource), []byte(strconv.FormatUint(uint64(token), 10))
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("zkfence: fenced multi on %q: %w", resource, err)
		}
		data, stat, err := g.Conn.Get(fp)
		var fenceOp any
		switch {
		case errors.Is(err, zk.ErrNoNode):
			if err := g.createParents(fp); err != nil {
				return nil, fmt.Errorf("zkfence: create the parents of %s: %w", fp, err)
			}
			fenceOp = &zk.CreateRequest{Path: fp, Data: enc, Acl: g.acl()}
		case err != nil:
			return nil, fmt.Errorf("zkfence: read the fence of %q: %w", resource, err)
		default:
			hi, perr := strconv.ParseUint(string(data), 10, 64)
			if perr != nil {
				return nil, fmt.Errorf("zkfence: the fence of %q is not a token: %w", resource, perr)
			}
			if uint64(token) < hi {
				return nil, g.reject(&fencing.StaleTokenError{Resource: resource, Token: token, Highest: dlock.Token(hi)})
			}
			// Set with the version read: fails if the fence moved since.
			fenceOp = &zk.SetDataRequest{Path: fp, Data: enc, Version: stat.Version}
		}
		res, err := g.Conn.Multi(append([]any{fenceOp}, ops...)...)
		if err == nil {
			return res[1:], nil
		}
		if len(res) > 0 && (errors.Is(res[0].Error, zk.ErrBadVersion) || errors.Is(res[0].Error, zk.ErrNodeExists) || errors.Is(res[0].Error, zk.ErrNoNode)) {
			continue // another writer changed the fence: compare again
		}
		for _, r := range res { // the first failed op; those after it fail as inconsistent
			if r.Error != nil {
				err = r.Error
				break
			}
		}
		return nil, fmt.Errorf("zkfence: fenced multi on %q: %w", resource, err)
	}
}

// Set sets path's data (any version) if token is current for resource, in
// one multi with the fence's update (see Multi). path must exist.
func (g *Guard) Set(ctx context.Context, token dlock.Token, resource, path string, data []byte) error {
	_, err := g.Multi(ctx, token, resource, &zk.SetDataRequest{Path: path, Data: data, Version: -1})
	return err
}

// Create creates the persistent node path with data if token is current for
// resource, in one multi with the fence's update (see Multi).
func (g *Guard) Create(ctx context.Context, token dlock.Token, resource, path string, data []byte) error {
	_, err := g.Multi(ctx, token, resource, &zk.CreateRequest{Path: path, Data: data, Acl: g.acl()})
	return err
}

// Delete deletes path (any version) if token is current for resource, in
// one multi with the fence's update (see Multi). The fence stays.
func (g *Guard) Delete(ctx context.Context, token dlock.Token, resource, path string) error {
	_, err := g.Multi(ctx, token, resource, &zk.DeleteRequest{Path: path, Version: -1})
	return err
}

// Highest returns the highest token accepted for resource (0 if none).
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Token, error) {
	if g.Conn == nil {
		return 0, errors.New("zkfence: Guard.Conn is nil")
	}
	data, _, err := g.Conn.Get(g.FencePath(resource))
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("zkfence: read the fence of %q: %w", resource, err)
	}
	tok, err := strconv.ParseUint(string(data), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("zkfence: the fence of %q is not a token: %w", resource, err)
	}
	return dlock.Token(tok), nil
}

// createParents creates the missing ancestors of p, as empty persistent
// nodes.
func (g *Guard) createParents(p string) error {
	for i := 1; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		_, err := g.Conn.Create(p[:i], nil, 0, g.acl())
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

func (g *Guard) reject(e *fencing.StaleTokenError) error {
	if g.OnReject != nil {
		g.OnReject(e)
	}
	return e
}
