//go:build unix

package sysmon

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
)

// Reexec replaces the process with the same program, arguments and
// environment plus [Setting] (same PID: execve), unless [Env] adds nothing.
// It returns nil without exec'ing then; it does not return when it
// exec'ed; an error means the process goes on as it was, its sysmon
// sleeping as usual. Call it before the process opens anything a second
// start would open again: only descriptors without close-on-exec (Go opens
// none of its own so) survive.
//
// It execs the executable's path, so the process keeps its name (comm, what
// ps and pgrep match: execve names a process after the path it was given).
// If that path is gone or cannot be run, it execs the running binary through
// /proc/self/exe on Linux, and the process is then named "exe". (A binary
// replaced at that path since the start is the one that runs, as after a
// restart.)
func Reexec() error {
	env, add := Env(os.Environ())
	if !add {
		return nil
	}
	exe, err := os.Executable()
	if err == nil {
		err = syscall.Exec(exe, os.Args, env)
	}
	if err != nil && runtime.GOOS == "linux" {
		if err2 := syscall.Exec("/proc/self/exe", os.Args, env); err2 != nil {
			err = fmt.Errorf("%w; /proc/self/exe: %w", err, err2)
		}
	}
	return fmt.Errorf("keep sysmon awake: exec %q: %w", exe, err)
}
