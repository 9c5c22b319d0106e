package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redis"
)

// redisAdmin is a plain go-redis client on the server of a redis:// or
// rediss:// DSN, for what the driver does not do: deleting the keys a check
// or a benchmark leaves behind (fence counters have no TTL), and making the
// server forget a holder in check.
type redisAdmin struct {
	client *goredis.Client
	prefix string // the driver's key prefix
}

// isRedis reports whether u is a DSN of the single-Redis driver.
func isRedis(u *url.URL) bool { return u.Scheme == "redis" || u.Scheme == "rediss" }

// redisPrefix returns the key prefix a redis:// or redlock:// DSN sets.
func redisPrefix(u *url.URL) string {
	if p := u.Query().Get("prefix"); p != "" {
		return p
	}
	return redis.DefaultPrefix
}

// newRedisAdmin connects to the server of a redis:// or rediss:// DSN. Its
// errors never contain the password.
func newRedisAdmin(dsn string) (*redisAdmin, error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	prefix := redisPrefix(u)
	q := u.Query()
	// The parameters of dlock and of the driver are not go-redis's; nor are
	// those a newer driver may add, which go-redis names in its error.
	for _, p := range []string{"ttl", "autorenew", "prefix", "poll", "min_replicas", "wait_timeout", "checks"} {
		q.Del(p)
	}
	for {
		cu := *u
		cu.RawQuery = q.Encode()
		opt, err := goredis.ParseURL(cu.String())
		if err == nil {
			return &redisAdmin{client: goredis.NewClient(opt), prefix: prefix}, nil
		}
		names, ok := strings.CutPrefix(err.Error(), "redis: unexpected option: ")
		if !ok || !q.Has(strings.Split(names, ", ")[0]) {
			return nil, backend.RedactError(err, u)
		}
		for _, name := range strings.Split(names, ", ") {
			q.Del(name)
		}
	}
}

func (a *redisAdmin) Close() error { return a.client.Close() }

// forget deletes the lock on key, as the server does when it expires; for
// the key of a permit's slot (NAME/permits/i) held in the semaphore NAME, it
// removes that slot's permit, as the next script's sweep does once the
// permit's expiry has passed.
func (a *redisAdmin) forget(ctx context.Context, key string) error {
	k := redis.LockKey(a.prefix, key)
	n, err := a.client.Del(ctx, k).Result()
	if err != nil {
		return fmt.Errorf("DEL %s: %w", k, err)
	}
	if i := strings.LastIndex(key, "/permits/"); n == 0 && i > 0 {
		name, slot := key[:i], key[i+len("/permits/"):]
		pipe := a.client.TxPipeline()
		zrem := pipe.ZRem(ctx, redis.PermitsKey(a.prefix, name), slot)
		pipe.HDel(ctx, redis.PermitHoldersKey(a.prefix, name), slot)
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("remove slot %s of %s: %w", slot, redis.PermitsKey(a.prefix, name), err)
		}
		if zrem.Val() == 1 {
			return nil
		}
	}
	if n != 1 {
		return fmt.Errorf("the lock key %s did not exist", k)
	}
	return nil
}

// permits returns the number of permits the holders of the counted
// semaphore name use (in the driver's own layout), 0 if none is recorded.
func (a *redisAdmin) permits(ctx context.Context, name string) (int, error) {
	k := redis.PermitsKey(a.prefix, name) + ":size"
	n, err := a.client.Get(ctx, k).Int()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", k, err)
	}
	return n, nil
}

// deleteFences deletes the fence counters of keys.
func (a *redisAdmin) deleteFences(ctx context.Context, keys ...string) error {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = redis.FenceKey(a.prefix, k)
	}
	return a.client.Del(ctx, names...).Err()
}

// deletePrefix deletes every key that starts with the admin's prefix, and
// returns how many it deleted.
func (a *redisAdmin) deletePrefix(ctx context.Context) (int, error) {
	pattern := globEscape(a.prefix) + "*"
	n := 0
	iter := a.client.Scan(ctx, 0, pattern, 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		d, err := a.client.Del(ctx, batch...).Result()
		n += int(d)
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return n, err
	}
	return n, flush()
}

// globEscape escapes the characters that SCAN's MATCH pattern gives a
// meaning.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
