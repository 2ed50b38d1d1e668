//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package proxy

// maxConns is the cap on agents' connections (listener.go): no file
// descriptor limit to read here.
func maxConns() int { return 1 << 20 }
