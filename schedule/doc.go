// Package schedule runs scheduled jobs across a fleet on any dlock.Locker
// whose locks can outlive their holder (dlock.Lease.Orphan): Redis, the table
// locks (pgtable://, mysqltable://), etcd and memlock.
//
// [Run] runs one scheduled run of a job — a job name and the run's scheduled
// time — at most once across every node that calls it, whatever their clocks
// say: the first node to claim the run runs it, and a record of the run,
// stored on the backend with the run's fencing token for [Job.Retention],
// turns every later node away, even one whose clock is seconds behind. A
// [Job]'s AtMost and AtLeast are ShedLock's lockAtMostFor and lockAtLeastFor;
// its Mode says whether a run whose node dies is repeated. [Every] is a small
// loop that calls Run at every multiple of a period.
//
// [Once] runs a function at most once per key across the fleet, for
// idempotency keys, and tells a caller that retries whether the work
// completed, is in progress elsewhere, or must be redone.
//
// docs/schedule.md states the guarantees and what they rest on.
package schedule
