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
func Reexec() error {
	env, add := Env(os.Environ())
	if !add {
		return nil
	}
	exe := "/proc/self/exe" // the running binary, even if its file was replaced
	if runtime.GOOS != "linux" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("keep sysmon awake: %w", err)
		}
	}
	return fmt.Errorf("keep sysmon awake: exec %s: %w", exe, syscall.Exec(exe, os.Args, env))
}
