package rediscore

import "testing"

// TestKeyOfInvertsLockKey: KeyOf gives back the key of every lock key, and
// refuses the fence key, the release channel and keys of other layouts.
func TestKeyOfInvertsLockKey(t *testing.T) {
	for _, key := range []string{"jobs/nightly", "a%b", "{x}", "%7B", "ünï code", "a:fence"} {
		got, ok := KeyOf("dlock:", LockKey("dlock:", key))
		if !ok || got != key {
			t.Errorf("KeyOf(LockKey(%q)) = %q, %v", key, got, ok)
		}
	}
	for _, name := range []string{FenceKey("dlock:", "k"), ReleaseChannel("dlock:", "k"), "dlock:k", "other:{k}", "dlock:{a}b}"} {
		if got, ok := KeyOf("dlock:", name); ok {
			t.Errorf("KeyOf(%q) = %q, want not a lock key", name, got)
		}
	}
	if owner, label := SplitHolder(HolderValue("abc", "host:1 x")); owner != "abc" || label != "host:1 x" {
		t.Errorf("SplitHolder(HolderValue) = %q, %q", owner, label)
	}
}
