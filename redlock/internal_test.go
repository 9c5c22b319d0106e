package redlock

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
)

func TestDrift(t *testing.T) {
	d := &Driver{driftFactor: DefaultDriftFactor}
	for _, ttl := range []time.Duration{time.Second, 10 * time.Second, 1234567 * time.Microsecond} {
		if got, want := d.drift(ttl), backend.DriftAllowance(ttl); got != want {
			t.Errorf("drift(%v) = %v, want backend.DriftAllowance = %v", ttl, got, want)
		}
	}
	d.driftFactor = 0.2
	if got, want := d.drift(10*time.Second), 2002*time.Millisecond; got != want {
		t.Errorf("drift(10s) with factor 0.2 = %v, want %v", got, want)
	}
	d.nodeTimeout = DefaultNodeTimeout
	ms, validity, nodeTimeout, err := d.ttlMillis(500*time.Millisecond + 700*time.Microsecond)
	if err != nil || ms != 500 || validity != 500*time.Millisecond-d.drift(500*time.Millisecond+700*time.Microsecond) || nodeTimeout != 50070*time.Microsecond {
		t.Errorf("ttlMillis(500.7ms) = %d, %v, %v, %v", ms, validity, nodeTimeout, err)
	}
}
