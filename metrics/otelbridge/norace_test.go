//go:build !race

package otelbridge

// raceEnabled is set when the race detector runs: allocation counts are
// not checked then.
const raceEnabled = false
