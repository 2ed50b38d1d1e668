package proxy

import (
	"bytes"
	"io"
	"testing"
	"testing/iotest"
)

func TestPeekEvent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"one event", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n", "data: {\"a\":1}\n\n"},
		{"priming first", "id: 1\ndata: \n\nevent: message\ndata: {\"x\":1}\n\nrest", "id: 1\ndata: \n\nevent: message\ndata: {\"x\":1}\n\n"},
		{"comment first", ": keepalive\n\ndata: {}\n\n", ": keepalive\n\ndata: {}\n\n"},
		{"crlf", "data: {}\r\n\r\nmore", "data: {}\r\n\r\n"},
		{"cr only", "data: {}\r\rmore", "data: {}\r\r"},
		{"no space", "data:{}\n\n", "data:{}\n\n"},
		{"stream ends in an event", "data: {\"partial", "data: {\"partial"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// One byte per Read: events straddle reads.
			r := iotest.OneByteReader(bytes.NewReader([]byte(tt.in)))
			got, err := peekEvent(r, nil, 1<<20)
			if err != nil {
				t.Fatalf("peekEvent: %v", err)
			}
			if !bytes.HasPrefix([]byte(tt.in), got) || !bytes.HasPrefix(got, []byte(tt.want)) {
				t.Fatalf("peekEvent(%q) = %q, want it to start with %q", tt.in, got, tt.want)
			}
			if len(got) > len(tt.want)+0 && tt.want != tt.in && bytes.Count(got, []byte("data:")) > bytes.Count([]byte(tt.want), []byte("data:")) {
				t.Fatalf("peekEvent(%q) = %q read past the first data event", tt.in, got)
			}
		})
	}
}

// TestPeekEventNoAnswer: a stream that ends with no data event (only a
// priming event, or nothing) is no answer.
func TestPeekEventNoAnswer(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "id: 1\ndata: \n\n", ": keepalive\n\n"} {
		if _, err := peekEvent(bytes.NewReader([]byte(in)), nil, 1024); err != errNoEvent {
			t.Errorf("peekEvent(%q) error = %v, want errNoEvent", in, err)
		}
	}
}

func TestPeekEventLimit(t *testing.T) {
	t.Parallel()
	in := bytes.Repeat([]byte(": padding\n"), 1000)
	got, err := peekEvent(bytes.NewReader(in), nil, 1024)
	if err != errPeekTooLarge || len(got) < 1024 {
		t.Fatalf("peekEvent over limit = %d bytes, %v; want errPeekTooLarge", len(got), err)
	}
}

func TestPeekEventError(t *testing.T) {
	t.Parallel()
	r := io.MultiReader(bytes.NewReader([]byte("data: {")), iotest.ErrReader(io.ErrUnexpectedEOF))
	if _, err := peekEvent(r, nil, 1024); err != io.ErrUnexpectedEOF {
		t.Fatalf("peekEvent error = %v, want ErrUnexpectedEOF", err)
	}
}

func TestFindResponse(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"id: 1\ndata:\n\ndata: {\"method\":\"notifications/progress\"}\n\ndata: {\"id\":1,\"result\":{}}\n\n", `{"id":1,"result":{}}`},
		{"data: {\"id\":1,\"error\":{}}", `{"id":1,"error":{}}`},
		{"data: {\"method\":\"x\"}\n\n", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := string(findResponse([]byte(tt.in))); got != tt.want {
			t.Errorf("findResponse(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
