//go:build unix

package redistest

import (
	"os"
	"syscall"
)

var (
	sigStop os.Signal = syscall.SIGSTOP
	sigCont os.Signal = syscall.SIGCONT
)

// killProcess sends SIGKILL to p's process group (p leads it), falling back
// to p alone.
func killProcess(p *os.Process) {
	if err := syscall.Kill(-p.Pid, syscall.SIGKILL); err != nil {
		_ = p.Kill()
	}
}
