// Package pulsetest stops the test's own process for a while, as a starved
// CPU or a suspended VM would: every goroutine stands still, timers and
// replies pile up.
package pulsetest

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// StopSelf has a shell stop this process (SIGSTOP) for d and continue it
// (SIGCONT); it returns once the process runs again. It fails t if no
// shell or kill can do it.
func StopSelf(t testing.TB, d time.Duration) {
	t.Helper()
	pid := os.Getpid()
	cmd := exec.Command("sh", "-c", fmt.Sprintf("kill -STOP %d; sleep %.3f; kill -CONT %d", pid, d.Seconds(), pid))
	if err := cmd.Run(); err != nil {
		t.Fatalf("stopping this process with sh and kill: %v", err)
	}
}
