package cluster

import "syscall"

// sysProcAttr puts a child in its own process group (so a kill reaches
// everything it started) and kills it if this process dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
