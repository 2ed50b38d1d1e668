//go:build !unix

package sysmon

import "errors"

// Reexec is not available without exec(2): the process goes on as it is.
func Reexec() error { return errors.New("keep sysmon awake: no exec on this system") }
