package classify

import "testing"

// TestFirstData checks the first-event peek; the line and field rules it
// relies on are package sse's.
func TestFirstData(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, s, want string }{
		{"plain", "data: {}\n\n", "{}"},
		{"no space", "data:{}\n\n", "{}"},
		{"one space dropped only", "data:  {}\n", " {}"},
		{"priming skipped", "id: a\ndata: \n\nevent: message\nid: b\ndata: {}\n\n", "{}"},
		{"bare data skipped", "data\n\ndata: x\n", "x"},
		{"whitespace data skipped", "data: \t \n\ndata: x\n", "x"},
		{"comments and fields skipped", ": hi\nretry: 10\nevent: e\nid: 1\ndata: x\n", "x"},
		{"CRLF", "data: x\r\n\r\n", "x"},
		{"CR", "id: 1\rdata: x\r\r", "x"},
		{"CR then LF ends two lines", "data\r\ndata: x\ry\n", "x"},
		{"lone CR before LF", "id: 1\r\n\rdata: x\n", "x"},
		{"CR ends the value", "data: x\rdata: y\n", "x"},
		{"lone LF line", "\n", ""},
		{"comment holding data", ":data: x\n", ""},
		{"data without colon", "data x\n", ""},
		{"unterminated", "data: x", "x"},
		{"none", ": keepalive\n\n", ""},
		{"empty", "", ""},
		{"BOM and blank lines", bom + "\r\n data: x\n", "x"},
		{"other field", "datum: x\n", ""},
		{"case-sensitive", "DATA: x\n", ""},
	} {
		if got := firstData(tc.s); got != tc.want {
			t.Errorf("firstData(%s: %q) = %q, want %q", tc.name, tc.s, got, tc.want)
		}
	}
}

func TestIsEventStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ct   string
		want bool
	}{
		{"text/event-stream", true},
		{"TEXT/Event-Stream", true},
		{"text/event-stream; charset=utf-8", true},
		{"text/event-stream ;charset=utf-8", true},
		{"\ttext/event-stream", true},
		{"text/event-streams", false},
		{"text/event", false},
		{"application/json", false},
		{"", false},
	} {
		if got := isEventStream(tc.ct); got != tc.want {
			t.Errorf("isEventStream(%q) = %v, want %v", tc.ct, got, tc.want)
		}
	}
}
