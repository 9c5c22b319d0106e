package postgres

// SetBreakHook makes Break call f with the key between its read of the
// holder and its removal; restore removes it.
func SetBreakHook(f func(key string)) (restore func()) {
	breakHook.Store(&f)
	return func() { breakHook.Store(nil) }
}

// SetBreakCheckedHook makes Break call f with the key between its check that
// the holder it read still holds the lock and its removal; restore removes
// it.
func SetBreakCheckedHook(f func(key string)) (restore func()) {
	breakCheckedHook.Store(&f)
	return func() { breakCheckedHook.Store(nil) }
}
