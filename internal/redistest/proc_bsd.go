//go:build unix && !linux

package redistest

import "syscall"

// sysProcAttr puts redis-server in its own process group, so Kill reaches
// anything it forks.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
