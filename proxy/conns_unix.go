//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package proxy

import "syscall"

// maxConns is the cap on agents' connections: three quarters of the file
// descriptor limit (at least 16).
func maxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 || rl.Cur > 1<<24 {
		return 1 << 20
	}
	return max(int(rl.Cur)*3/4, 16)
}
