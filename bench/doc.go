// Package bench compares dlock with peer lock libraries on the same servers in
// the same run. It is a separate module, so that users of dlock never download
// the peer libraries.
//
//	cd bench && go test -run '^$' -bench . -benchtime 2s -count 3
//
// The servers are real, started by dlock's internal/testenv on free loopback
// ports (see scripts/install-test-deps.sh).
package bench
