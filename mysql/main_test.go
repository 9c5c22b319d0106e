package mysql_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/conformance"
)

func TestMain(m *testing.M) {
	conformance.Main(m) // in a child process of the fault suite, runs the child and exits
	goleak.VerifyTestMain(m)
}
