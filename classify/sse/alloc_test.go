//go:build !race

package sse

import (
	"bytes"
	"testing"
)

// TestLinesLoneCRLinear: lines ended by a CR alone, with no LF anywhere
// after them, are found without rescanning the rest of the piece per line.
func TestLinesLoneCRLinear(t *testing.T) {
	p := bytes.Repeat([]byte("data: x\r"), 1<<17) // 1 MiB, 131072 lines
	var l Lines
	lines := 0
	allocs := testing.AllocsPerRun(1, func() {
		lines = 0
		l = Lines{}
		for q := p; len(q) > 0; {
			n, _, ended := l.Next(q)
			if ended {
				lines++
			}
			q = q[n:]
		}
	})
	if lines != 1<<17 || allocs != 0 {
		t.Fatalf("%d lines, %v allocs", lines, allocs)
	}
}
