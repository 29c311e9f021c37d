package tierlimit_test

import (
	"os"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestMain runs a fleet member instead of the tests when this binary is
// re-executed by runFleet or the lifecycle tests, and otherwise the tests;
// either way with go-redis's own log lines (a dial refused while a test
// has Redis down) kept out of the output (see redistest.QuietClientLogs):
// a member's stderr is the test's output.
func TestMain(m *testing.M) {
	redistest.QuietClientLogs()
	if tier := os.Getenv(lifecycleEnv); tier != "" {
		os.Exit(lifecycleChild(tier))
	}
	if spec := os.Getenv("TIERLIMIT_FLEET_MEMBER"); spec != "" {
		if strings.Contains(spec, `"Fault":true`) {
			os.Exit(faultMember(spec))
		}
		os.Exit(fleetMember(spec))
	}
	os.Exit(m.Run())
}
