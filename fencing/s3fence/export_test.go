package s3fence

import "github.com/dlock-go/dlock"

// SetHookBeforePut sets testHookBeforePut until the returned func is called.
func SetHookBeforePut(f func(key string, token dlock.Token)) (restore func()) {
	testHookBeforePut = f
	return func() { testHookBeforePut = nil }
}
