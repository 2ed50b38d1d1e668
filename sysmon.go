package main

import (
	"strconv"
	"strings"
)

// sysmonAwake reports whether the Go runtime of a process started with
// godebug as its GODEBUG keeps its system monitor (sysmon) awake: whether
// schedtrace, as the runtime reads it at start, is above 0. While it is,
// sysmon sleeps at most 10 ms at a time and never parks, so the system calls
// of the next request need not wake it (runtime/proc.go, func sysmon). The
// image and the Kubernetes examples set GODEBUG=schedtrace=2147483647 for
// this; the bare binary runs with Go's default unless its operator sets it
// (docs/deployment.md "Keeping the runtime's sysmon awake").
//
// Like the runtime (runtime/runtime1.go, parsegodebug), it takes the
// entries left to right and the last schedtrace whose value parses as an
// int32 wins; an entry whose value does not is ignored. The runtime reads
// schedtrace only at start, and mcpheal never changes GODEBUG.
func sysmonAwake(godebug string) bool {
	var n int64
	for f := range strings.SplitSeq(godebug, ",") {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k != "schedtrace" {
			continue
		}
		if m, err := strconv.ParseInt(v, 10, 32); err == nil {
			n = m
		}
	}
	return n > 0
}
