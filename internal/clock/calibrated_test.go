//go:build linux

package clock

import (
	"sync"
	"testing"
	"time"
)

// fakeSources are the clocks calibrated reads — the monotonic clock, the wall
// clock and CLOCK_BOOTTIME — moved by the test, with a count of the
// (system-call) reads of CLOCK_BOOTTIME.
type fakeSources struct {
	mu        sync.Mutex
	mono      time.Duration
	wall      time.Duration
	boot      time.Duration
	bootNoise time.Duration // taken off the next CLOCK_BOOTTIME read (a read that lagged)
	bootReads int
}

func (f *fakeSources) clocks() (wall, mono time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wall, f.mono
}

func (f *fakeSources) readBoot() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bootReads++
	b := f.boot - f.bootNoise
	f.bootNoise = 0
	return b, true
}

// run advances every clock by d: time passing while the host runs.
func (f *fakeSources) run(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mono += d
	f.wall += d
	f.boot += d
}

// sleep advances the wall clock and CLOCK_BOOTTIME by d, not the monotonic
// clock: a suspend, as the kernel accounts for it.
func (f *fakeSources) sleep(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wall += d
	f.boot += d
}

func (f *fakeSources) reads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bootReads
}

func newFake() (*fakeSources, *calibrated) {
	f := &fakeSources{wall: 1_800_000_000 * time.Second, boot: 5 * time.Hour}
	return f, newCalibrated(f.readBoot, f.clocks)
}

// TestCalibratedCountsASuspend: a reading after a suspend includes it, as
// CLOCK_BOOTTIME does.
func TestCalibratedCountsASuspend(t *testing.T) {
	f, c := newFake()
	a := c.now()
	f.run(time.Second)
	f.sleep(time.Minute)
	f.run(time.Millisecond)
	if got, want := c.now()-a, time.Minute+time.Second+time.Millisecond; got != want {
		t.Fatalf("elapsed across a 1m suspend: %v, want %v", got, want)
	}
}

// TestCalibratedReadsBoottimeOnlyWhenItMayHaveChanged: while the wall clock
// keeps pace with the monotonic one, readings cost no CLOCK_BOOTTIME read; a
// step of the wall clock (which is no suspend) costs one and moves nothing.
func TestCalibratedReadsBoottimeOnlyWhenItMayHaveChanged(t *testing.T) {
	f, c := newFake()
	before := f.reads()
	a := c.now()
	for range 1000 {
		f.run(time.Millisecond)
		c.now()
	}
	if n := f.reads() - before; n != 0 {
		t.Fatalf("%d CLOCK_BOOTTIME reads while nothing was suspended, want 0", n)
	}
	f.mu.Lock()
	f.wall -= time.Hour // the wall clock stepped back (settimeofday)
	f.mu.Unlock()
	b := c.now()
	if n := f.reads() - before; n != 1 {
		t.Fatalf("%d CLOCK_BOOTTIME reads after a wall-clock step, want 1", n)
	}
	if got := b - a; got != time.Second {
		t.Fatalf("elapsed across a wall-clock step: %v, want 1s (the monotonic time)", got)
	}
}

// TestCalibratedNeverGoesBack: a CLOCK_BOOTTIME read that lags (it is read
// between two monotonic reads) never moves a reading back.
func TestCalibratedNeverGoesBack(t *testing.T) {
	f, c := newFake()
	last := c.now()
	for i := range 100 {
		f.run(time.Microsecond)
		f.mu.Lock()
		f.wall += 2 * time.Millisecond // a slewed wall clock: recalibrate every time
		f.bootNoise = time.Duration(i%7) * time.Microsecond
		f.mu.Unlock()
		if now := c.now(); now < last {
			t.Fatalf("reading %d went back from %v to %v", i, last, now)
		} else {
			last = now
		}
	}
}
