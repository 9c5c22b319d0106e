// Package hook holds package schedule's test hooks, which its tests and
// package scheduletest set.
package hook

// BreakRecordCheck makes package schedule ignore the records it finds, to
// show that the tests catch a run made twice.
var BreakRecordCheck bool

// ClockKey is the context key of a func() time.Time that Every reads
// instead of time.Now.
type ClockKey struct{}
