//go:build race

package hybrid

// raceEnabled is set when the race detector runs: allocation counts are
// not checked then.
const raceEnabled = true
