//go:build !unix

package sysmon

// Reexec does nothing where there is no exec(2): the process goes on as it
// is, its sysmon sleeping as usual ([Awake] reports false).
func Reexec() error { return nil }
