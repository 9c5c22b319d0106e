// Package etcdfence fences writes to etcd by dlock's tokens: one transaction
// compares the resource's fence key with the token and, in the same
// transaction, runs the caller's operations and advances the fence. An etcd
// transaction is atomic and serialised with every other write, so the check
// and the write are one step. Like fencing.Guard, a token equal to or above
// the fence is accepted and a lower one, or 0, is rejected with a
// *fencing.StaleTokenError. docs/guards.md has the pattern.
package etcdfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// DefaultPrefix is Guard.Prefix's default.
const DefaultPrefix = "/dlock/fence/"

// Guard runs fenced transactions on etcd. It holds no state and is safe for
// concurrent use; Client is required.
type Guard struct {
	// Client runs the transactions: a *clientv3.Client or any clientv3.KV.
	// Required.
	Client clientv3.KV

	// Prefix is prepended to a resource's name to make its fence key, which
	// holds the highest token accepted as 20 zero-padded decimal digits (so
	// that etcd's byte-wise comparison is numeric). Default DefaultPrefix.
	Prefix string

	// OnReject, if set, is called with every rejection of a stale token:
	// count it (package dlockotel's RejectionCounter) or log it. It must not
	// block.
	OnReject func(*fencing.StaleTokenError)
}

// FenceKey returns resource's fence key.
func (g *Guard) FenceKey(resource string) string {
	if g.Prefix == "" {
		return DefaultPrefix + resource
	}
	return g.Prefix + resource
}

// encode renders a token so that byte order is numeric order.
func encode(tok dlock.Token) string { return fmt.Sprintf("%020d", uint64(tok)) }

// Txn runs ops, then puts token in resource's fence key, in one transaction
// that first checks that the fence is missing or at most token. It returns
// the responses of ops, in order, as a succeeded transaction; a stale token
// fails with a *fencing.StaleTokenError and runs nothing. ops must not touch
// the fence key.
//
// The transaction is If(fence missing) Then(ops, fence) Else(Txn(If(fence
// > token) Then(Get fence) Else(ops, fence))): etcd fails a value
// comparison on a missing key, so the nested transaction tells the cases
// apart in the same round trip.
func (g *Guard) Txn(ctx context.Context, token dlock.Token, resource string, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if g.Client == nil {
		return nil, errors.New("etcdfence: Guard.Client is nil")
	}
	if resource == "" {
		return nil, errors.New("etcdfence: empty resource")
	}
	if token == 0 {
		return nil, g.reject(&fencing.StaleTokenError{Resource: resource, Token: token})
	}
	fk, enc := g.FenceKey(resource), encode(token)
	then := append(append([]clientv3.Op(nil), ops...), clientv3.OpPut(fk, enc))
	resp, err := g.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(fk), "=", 0)).
		Then(then...).
		Else(clientv3.OpTxn( // etcd compares by =, !=, < and >: stale is fence > token
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(fk), ">", enc)},
			[]clientv3.Op{clientv3.OpGet(fk)},
			then)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("etcdfence: fenced transaction on %q: %w", resource, err)
	}
	rs := resp.Responses
	if !resp.Succeeded {
		inner := rs[0].GetResponseTxn()
		if inner.Succeeded {
			hi := highest(inner.Responses[0].GetResponseRange())
			return nil, g.reject(&fencing.StaleTokenError{Resource: resource, Token: token, Highest: hi})
		}
		rs = inner.Responses
	}
	out := (*clientv3.TxnResponse)(&pb.TxnResponse{Header: resp.Header, Succeeded: true, Responses: rs[:len(ops)]})
	return out, nil
}

// Put puts val in key if token is current for resource, in one transaction
// with the check (see Txn).
func (g *Guard) Put(ctx context.Context, token dlock.Token, resource, key, val string, opts ...clientv3.OpOption) error {
	_, err := g.Txn(ctx, token, resource, clientv3.OpPut(key, val, opts...))
	return err
}

// Delete deletes key (a range with opts) if token is current for resource,
// in one transaction with the check (see Txn), and returns how many keys it
// deleted. The fence stays.
func (g *Guard) Delete(ctx context.Context, token dlock.Token, resource, key string, opts ...clientv3.OpOption) (int64, error) {
	resp, err := g.Txn(ctx, token, resource, clientv3.OpDelete(key, opts...))
	if err != nil {
		return 0, err
	}
	return resp.Responses[0].GetResponseDeleteRange().Deleted, nil
}

// Highest returns the highest token accepted for resource (0 if none).
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Token, error) {
	if g.Client == nil {
		return 0, errors.New("etcdfence: Guard.Client is nil")
	}
	resp, err := g.Client.Get(ctx, g.FenceKey(resource))
	if err != nil {
		return 0, fmt.Errorf("etcdfence: read the fence of %q: %w", resource, err)
	}
	return highest((*pb.RangeResponse)(resp)), nil
}

// highest parses the fence in a range response (0 if missing or not a
// token).
func highest(r *pb.RangeResponse) dlock.Token {
	if r == nil || len(r.Kvs) == 0 {
		return 0
	}
	tok, err := strconv.ParseUint(string(r.Kvs[0].Value), 10, 64)
	if err != nil {
		return 0
	}
	return dlock.Token(tok)
}

func (g *Guard) reject(e *fencing.StaleTokenError) error {
	if g.OnReject != nil {
		g.OnReject(e)
	}
	return e
}
