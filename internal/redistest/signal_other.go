//go:build !unix

package redistest

import (
	"os"
	"syscall"
)

// sigStop and sigCont are nil where stopping a process is not supported;
// Pause and Resume then do nothing.
var sigStop, sigCont os.Signal

// sysProcAttr returns no special attributes on this platform.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// killProcess kills p.
func killProcess(p *os.Process) { _ = p.Kill() }
