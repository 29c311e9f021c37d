//go:build linux

package redistest

import "syscall"

// sysProcAttr puts redis-server in its own process group, so Kill reaches
// anything it forks, and asks the kernel to kill it if the test binary dies
// without running its cleanups.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
