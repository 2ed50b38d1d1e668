package wire

import (
	"io"
	"testing"
)

type commentFlood struct{ left int }

func (c *commentFlood) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return copy(p, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"), io.EOF
	}
	const ev = ": keepalive\n\n"
	n := 0
	for n+len(ev) <= len(p) {
		n += copy(p[n:], ev)
	}
	c.left -= n
	return n, nil
}

// TestPeekFirstCommentsBounded: comments and priming events before the
// first message count against peekLimit; they were held without bound.
func TestPeekFirstCommentsBounded(t *testing.T) {
	var er EventRewriter
	er.Gen = 1
	out, first, whole, ok := PeekFirst(&commentFlood{left: 64 << 20}, &er, nil, make([]byte, 16<<10))
	t.Logf("held back before the first data event: %d bytes (peekLimit %d); first=%q whole=%v ok=%v", len(out), PeekLimit, first, whole, ok)
	if len(out) > 4*PeekLimit {
		t.Fatalf("peekFirst buffered %d MiB of data-less events: unbounded", len(out)>>20)
	}
}
