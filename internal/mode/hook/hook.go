// Package hook carries package dlock's acquire modes, which are not part of
// its API, to package mode: dlock sets the variables at init, before any
// importer of mode runs. Import package mode, not this one.
package hook

// The acquire modes, set by package dlock at init: Shared returns a
// dlock.AcquireOption that takes the lock shared, Permits(n) one that takes
// one of n permits.
var (
	Shared  func() any
	Permits func(n int) any
)
