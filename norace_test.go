//go:build !race

package tierlimit_test

// raceEnabled is set when the race detector runs: the heaviest loops shrink.
const raceEnabled = false
