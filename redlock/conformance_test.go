package redlock_test

import (
	"testing"

	"github.com/dlock-go/dlock/conformance"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t, 5))
}

func BenchmarkConformance(b *testing.B) {
	conformance.RunBenchmarks(b, newHarness(b, 5))
}
