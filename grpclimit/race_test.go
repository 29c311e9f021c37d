//go:build race

package grpclimit

// raceEnabled is set when the race detector runs: allocation counts are
// not checked then.
const raceEnabled = true
