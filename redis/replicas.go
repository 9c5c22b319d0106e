package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
)

// ErrTooFewReplicas is matched by the error of an acquire or refresh when
// Options.MinReplicas is set and fewer replicas acknowledged the write within
// Options.WaitTimeout.
var ErrTooFewReplicas = errors.New("too few replicas acknowledged the lock")

// runWait runs script and then WAIT on one connection to the master that
// owns keys[0] (WAIT counts the replicas that acknowledged this
// connection's writes, so it must follow the write on the same connection).
// It returns the script's reply and the number of acknowledging replicas.
func (d *Driver) runWait(ctx context.Context, script *goredis.Script, keys []string, args ...any) (*goredis.Cmd, int64, error) {
	var c goredis.Cmdable = d.client
	if cc, ok := d.client.(*goredis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, 0, fmt.Errorf("cluster slot of %q: %w", keys[0], err)
		}
		c = m
	}
	for _, eval := range []bool{false, true} {
		pipe := c.Pipeline()
		var cmd *goredis.Cmd
		if eval {
			cmd = script.Eval(ctx, pipe, keys, args...)
		} else {
			cmd = script.EvalSha(ctx, pipe, keys, args...)
		}
		// Pipeliner has no Wait method; go-redis bounds the reply by
		// read_timeout (default 3s), which must exceed WaitTimeout.
		wait := pipe.Do(ctx, "wait", d.opts.MinReplicas, d.opts.WaitTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if err := cmd.Err(); err != nil {
			if !eval && goredis.HasErrorPrefix(err, "NOSCRIPT") {
				continue
			}
			return cmd, 0, err
		}
		n, err := wait.Int64()
		if err != nil {
			return cmd, 0, fmt.Errorf("WAIT: %w", err)
		}
		return cmd, n, nil
	}
	panic("unreachable")
}

// runScript runs script on keys and, when MinReplicas is set, WAIT after
// it (runWait). It returns the script's reply, never nil, and the replicas
// that acknowledged it (0 without MinReplicas); err is the script's error
// or WAIT's.
func (d *Driver) runScript(ctx context.Context, script *goredis.Script, keys []string, args ...any) (*goredis.Cmd, int64, error) {
	if d.opts.MinReplicas == 0 {
		cmd := script.Run(ctx, d.client, keys, args...)
		return cmd, 0, cmd.Err()
	}
	cmd, acks, err := d.runWait(ctx, script, keys, args...)
	if cmd == nil {
		cmd = goredis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd, acks, err
}

// runHeld runs, with runScript, a script that changes a hold only if the
// caller still has it (a renewal, a relabel) and replies 1 if it did, 0 if
// not. held is that answer. err is the script's error or WAIT's, as "<what>
// script: …", or the ErrTooFewReplicas of a change too few replicas
// acknowledged; held is true with either of the last two, since the master
// made the change.
func (d *Driver) runHeld(ctx context.Context, what string, script *goredis.Script, keys []string, args ...any) (held bool, err error) {
	cmd, acks, werr := d.runScript(ctx, script, keys, args...)
	n, err := cmd.Int64()
	switch {
	case err != nil:
		return false, fmt.Errorf("%s script: %w", what, err)
	case n == 0:
		return false, nil
	case werr != nil:
		return true, fmt.Errorf("%s script: %w", what, werr)
	case d.tooFewAcks(acks):
		return true, d.tooFew(acks)
	}
	return true, nil
}

// notHeld is err, or ErrNotHeld if a script found the hold gone (runHeld).
func notHeld(held bool, err error) error {
	if err == nil && !held {
		return backend.ErrNotHeld
	}
	return err
}

// tooFewAcks reports whether a write acknowledged by acks replicas falls
// short of MinReplicas.
func (d *Driver) tooFewAcks(acks int64) bool {
	return d.opts.MinReplicas > 0 && acks < int64(d.opts.MinReplicas)
}

// tooFew is the error for n acknowledging replicas.
func (d *Driver) tooFew(n int64) error {
	return fmt.Errorf("%w: %d of %d within %v", ErrTooFewReplicas, n, d.opts.MinReplicas, d.opts.WaitTimeout)
}
