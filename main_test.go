package tierlimit_test

import (
	"os"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/internal/redistest"
)

// TestMain runs a fleet member instead of the tests when this binary is
// re-executed by runFleet or the lifecycle tests, and otherwise the tests,
// with go-redis's own log lines (a dial refused while a test has Redis
// down) kept out of the output (see redistest.QuietClientLogs).
func TestMain(m *testing.M) {
	if tier := os.Getenv(lifecycleEnv); tier != "" {
		os.Exit(lifecycleChild(tier))
	}
	if spec := os.Getenv("TIERLIMIT_FLEET_MEMBER"); spec != "" {
		if strings.Contains(spec, `"Fault":true`) {
			os.Exit(faultMember(spec))
		}
		os.Exit(fleetMember(spec))
	}
	redistest.QuietClientLogs()
	os.Exit(m.Run())
}
