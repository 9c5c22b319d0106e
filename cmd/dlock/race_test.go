//go:build race

package main

// raceEnabled says whether the tests run with the race detector, so that the
// binary they build for end-to-end tests gets it too.
const raceEnabled = true
