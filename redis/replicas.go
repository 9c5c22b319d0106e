package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"
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

// tooFew is the error for n acknowledging replicas.
func (d *Driver) tooFew(n int64) error {
	return fmt.Errorf("%w: %d of %d within %v", ErrTooFewReplicas, n, d.opts.MinReplicas, d.opts.WaitTimeout)
}
