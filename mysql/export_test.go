package mysql

// SetRefreshHook makes Refresh call f with the lease's lock name while it
// holds the lease's mutex, before its statements; restore removes it.
func SetRefreshHook(f func(name string)) (restore func()) {
	refreshHook.Store(&f)
	return func() { refreshHook.Store(nil) }
}

// SetWatchHook makes every loss watcher call f at the start of each round;
// restore removes it.
func SetWatchHook(f func()) (restore func()) {
	watchHook.Store(&f)
	return func() { watchHook.Store(nil) }
}
