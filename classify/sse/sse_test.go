package sse

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// frame feeds stream to a Framer in pieces cut at the given offsets and
// returns the events and the unfinished rest.
func frame(t testing.TB, stream string, cuts []int) (events []string, rest string) {
	t.Helper()
	var f Framer
	prev := 0
	for _, c := range append(cuts, len(stream)) {
		f.Feed([]byte(stream[prev:c]))
		prev = c
		for {
			ev, ok, err := f.Next()
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if !ok {
				break
			}
			events = append(events, string(ev))
		}
	}
	return events, string(f.Rest())
}

// dataOf returns the data of every event that has any, in order.
func dataOf(events []string) []string {
	var out []string
	for _, ev := range events {
		if d := Data(nil, []byte(ev)); d != nil {
			out = append(out, string(d))
		}
	}
	return out
}

func TestFramer(t *testing.T) {
	big := strings.Repeat("x", 100<<10) // larger than any read buffer in mcpheal
	tests := []struct {
		name   string
		stream string
		data   []string // data of the complete events, in order
		rest   string   // the unfinished event at the end
	}{
		{name: "LF", stream: "data: a\n\ndata: b\n\n", data: []string{"a", "b"}},
		{name: "CRLF", stream: "data: a\r\n\r\ndata: b\r\n\r\n", data: []string{"a", "b"}},
		{name: "CR", stream: "data: a\r\rdata: b\r\r", data: []string{"a", "b"}},
		{name: "mixed endings", stream: "event: message\r\ndata: a\n\rdata: b\r\n\n", data: []string{"a", "b"}},
		{name: "comments", stream: ": keepalive\n\n: x\ndata: a\n\n", data: []string{"a"}},
		{name: "priming event", stream: "id: 1\ndata: \n\nid: 2\ndata: {}\n\n", data: []string{"", "{}"}},
		{name: "data without colon", stream: "data\n\n", data: []string{""}},
		{name: "retry and id", stream: "retry: 500\nid: 7\ndata: a\n\n", data: []string{"a"}},
		{name: "multi-line data", stream: "data: a\ndata: b\ndata:c\n\n", data: []string{"a\nb\nc"}},
		{name: "no space after colon", stream: "data:a\n\n", data: []string{"a"}},
		{name: "two spaces keep one", stream: "data:  a\n\n", data: []string{" a"}},
		{name: "other field named like data", stream: "database: x\ndata: a\n\n", data: []string{"a"}},
		{name: "larger than any buffer", stream: "data: " + big + "\n\n", data: []string{big}},
		{name: "ends mid-event", stream: "data: a\n\ndata: {\"result\":", data: []string{"a"}, rest: "data: {\"result\":"},
		{name: "ends after the data line", stream: "data: a\n", rest: "data: a\n"},
		{name: "ends mid-CRLF of the data line", stream: "data: a\r", rest: "data: a\r"},
		{name: "empty", stream: ""},
		{name: "only blank lines", stream: "\n\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			whole, rest := frame(t, tt.stream, nil)
			if got := dataOf(whole); !equal(got, tt.data) {
				t.Fatalf("data = %q, want %q", got, tt.data)
			}
			if rest != tt.rest {
				t.Fatalf("rest = %q, want %q", rest, tt.rest)
			}
			if strings.Join(whole, "")+rest != tt.stream {
				t.Fatalf("events and rest do not add up to the stream")
			}
			// The same events whatever the read sizes: one cut at every
			// byte boundary, and every byte alone.
			step := 1
			if len(tt.stream) > 4096 {
				step = 997
			}
			for c := 1; c < len(tt.stream); c += step {
				if ev, r := frame(t, tt.stream, []int{c}); !sameEvents(ev, r, whole, rest) {
					t.Fatalf("cut at %d: events %q rest %q, want %q %q", c, ev, r, whole, rest)
				}
			}
			if len(tt.stream) < 4096 {
				var cuts []int
				for c := 1; c < len(tt.stream); c++ {
					cuts = append(cuts, c)
				}
				if ev, r := frame(t, tt.stream, cuts); !equal(dataOf(ev), tt.data) || r != tt.rest ||
					strings.Join(ev, "")+r != tt.stream {
					t.Fatalf("byte by byte: events %q rest %q", ev, r)
				}
			}
		})
	}
}

// sameEvents compares two framings of one stream: the same data events and
// rest. A CRLF cut between its CR and LF may return the LF as a piece of
// its own, so the raw event lists may differ by such pieces.
func sameEvents(ev []string, rest string, want []string, wantRest string) bool {
	return equal(dataOf(ev), dataOf(want)) && rest == wantRest && strings.Join(ev, "") == strings.Join(want, "")
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFramerNeverEndsEarly guards the bug of the 4 KiB answers: a large
// event read in pieces is never complete before its blank line, however
// much of it looks like an answer.
func TestFramerNeverEndsEarly(t *testing.T) {
	t.Parallel()
	ev := "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"instructions\":\"" +
		strings.Repeat("y", 12<<10) + "\"}}\n\n"
	var f Framer
	for i := 0; i < len(ev); i += 4096 {
		f.Feed([]byte(ev[i:min(i+4096, len(ev))]))
		got, ok, err := f.Next()
		if err != nil {
			t.Fatal(err)
		}
		if end := i+4096 >= len(ev); ok != end {
			t.Fatalf("after %d bytes: complete = %v, want %v", min(i+4096, len(ev)), ok, end)
		} else if ok && string(got) != ev {
			t.Fatalf("event = %d bytes, want %d", len(got), len(ev))
		}
	}
}

func TestFramerMax(t *testing.T) {
	t.Parallel()
	f := Framer{Max: 64}
	f.Feed([]byte("data: small\n\n" + "data: " + strings.Repeat("z", 100)))
	if ev, ok, err := f.Next(); !ok || err != nil || string(Data(nil, ev)) != "small" {
		t.Fatalf("Next = %q %v %v, want the small event first", ev, ok, err)
	}
	if _, ok, err := f.Next(); ok || !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Next = %v %v, want ErrTooLarge", ok, err)
	}
	// A complete event at exactly the cap is fine.
	g := Framer{Max: 10}
	g.Feed([]byte("data: 12\n\n"))
	if _, ok, err := g.Next(); !ok || err != nil {
		t.Fatalf("event at the cap: %v %v", ok, err)
	}
}

func TestFramerReset(t *testing.T) {
	t.Parallel()
	var f Framer
	f.Feed(bytes.Repeat([]byte("a"), 1<<20))
	f.Reset(64 << 10)
	if cap(f.buf) != 0 || f.Buffered() != 0 {
		t.Fatalf("Reset kept %d bytes of capacity, %d buffered", cap(f.buf), f.Buffered())
	}
	f.Feed([]byte("data: a\n\n"))
	if ev, ok, _ := f.Next(); !ok || string(Data(nil, ev)) != "a" {
		t.Fatalf("after Reset: %q %v", ev, ok)
	}
}

func TestIDRetry(t *testing.T) {
	t.Parallel()
	ev := []byte("id: 1\r\nretry: 250\r\nid: 2\r\nretry: x\r\ndata: a\r\n\r\n")
	if id, ok := ID(ev); !ok || string(id) != "2" {
		t.Fatalf("ID = %q %v, want 2", id, ok)
	}
	if ms, ok := Retry(ev); !ok || ms != 250 {
		t.Fatalf("Retry = %d %v, want 250", ms, ok)
	}
	if _, ok := ID([]byte("data: a\n\n")); ok {
		t.Fatal("ID found in an event without one")
	}
	if _, ok := ID([]byte("id: a\x00b\n\n")); ok {
		t.Fatal("an id holding NUL is ignored (HTML §9.2.6)")
	}
}

// TestFeedLinear: a 12 MB single event fed in 4 KiB reads scans each byte
// once; the buffer grows by appends only (no re-copy per read).
func TestFeedLinear(t *testing.T) {
	t.Parallel()
	chunk := bytes.Repeat([]byte("x"), 4096)
	var f Framer
	f.Feed([]byte("data: "))
	grows := 0
	for i := 0; i < 3072; i++ {
		c := cap(f.buf)
		f.Feed(chunk)
		if cap(f.buf) != c {
			grows++
		}
		if _, ok, _ := f.Next(); ok {
			t.Fatal("an event without its blank line is not complete")
		}
		if f.scan != len(f.buf) {
			t.Fatalf("scanned %d of %d bytes", f.scan, len(f.buf))
		}
	}
	if grows > 64 { // appends grow geometrically: ~log(12 MB / 4 KiB) times
		t.Fatalf("the buffer grew %d times for 3072 reads: re-copied per read", grows)
	}
	f.Feed([]byte("\n\n"))
	if ev, ok, _ := f.Next(); !ok || len(ev) != 6+3072*4096+2 {
		t.Fatalf("12 MB event: %d bytes, complete %v", len(ev), ok)
	}
}

func BenchmarkFramer(b *testing.B) {
	for _, size := range []int{200, 64 << 10, 12 << 20} {
		stream := []byte("event: message\ndata: " + strings.Repeat("x", size) + "\n\n")
		b.Run(byteSize(size), func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			var f Framer
			for b.Loop() {
				for i := 0; i < len(stream); i += 4096 {
					f.Feed(stream[i:min(i+4096, len(stream))])
					for {
						if _, ok, _ := f.Next(); !ok {
							break
						}
					}
				}
			}
		})
	}
}

func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return strconv.Itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

// FuzzFramer: for any stream and any cut, the events and the rest add up to
// the stream, and two framings of one stream agree.
func FuzzFramer(f *testing.F) {
	for _, s := range []string{"data: a\n\n", "data: a\r\n\r\n", "data: a\r\r", ": c\n\nid: 1\ndata:\n\n", "data: a\ndata: b\n\nrest"} {
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, s string, cut int) {
		whole, rest := frame(t, s, nil)
		if strings.Join(whole, "")+rest != s {
			t.Fatalf("events and rest do not add up")
		}
		if len(s) == 0 {
			return
		}
		c := (cut%len(s) + len(s)) % len(s)
		ev, r := frame(t, s, []int{c})
		if !sameEvents(ev, r, whole, rest) {
			t.Fatalf("cut at %d: %q %q, want %q %q", c, ev, r, whole, rest)
		}
	})
}

func BenchmarkLinesLoneCR(b *testing.B) {
	p := bytes.Repeat([]byte("data: x\r"), 1<<17)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		var l Lines
		for q := p; len(q) > 0; {
			n, _, _ := l.Next(q)
			q = q[n:]
		}
	}
}

// TestLines: segments add up to the stream, every line is reported ended
// once, and a CRLF split across pieces gives its LF as a segment of its own
// that starts no line.
func TestLines(t *testing.T) {
	t.Parallel()
	stream := "data: a\r\n\r\nid: 1\rdata: b\n\n: c\r"
	for cut := 1; cut < len(stream); cut++ {
		var l Lines
		var got []string
		starts, ends := 0, 0
		for _, piece := range []string{stream[:cut], stream[cut:]} {
			for p := []byte(piece); len(p) > 0; {
				n, start, ended := l.Next(p)
				got = append(got, string(p[:n]))
				if start {
					starts++
				}
				if ended {
					ends++
				}
				p = p[n:]
			}
		}
		if strings.Join(got, "") != stream {
			t.Fatalf("cut %d: segments %q do not add up", cut, got)
		}
		// 6 lines; the LF of a CRLF cut in two is one more ended segment.
		split := (stream[cut-1] == '\r' && stream[cut] == '\n')
		wantEnds := 6
		if split {
			wantEnds++
		}
		if starts != 6 || ends != wantEnds {
			t.Fatalf("cut %d: %d starts, %d ends; want 6, %d (%q)", cut, starts, ends, wantEnds, got)
		}
	}
}

func TestHandover(t *testing.T) {
	t.Parallel()
	var f Framer
	f.Feed([]byte("data: a\r\n\r"))
	if _, ok, _ := f.Next(); !ok {
		t.Fatal("the event ended at its CR")
	}
	rest, l := f.Handover()
	if len(rest) != 0 {
		t.Fatalf("rest %q", rest)
	}
	if n, start, ended := l.Next([]byte("\ndata: b")); n != 1 || start || !ended {
		t.Fatalf("the LF after the handover: %d %v %v, want the end of the CRLF", n, start, ended)
	}
	f.Reset(0)
	f.Feed([]byte("data: a\n\ndata: partial"))
	f.Next()
	if rest, l = f.Handover(); string(rest) != "data: partial" || !l.AtLineStart() {
		t.Fatalf("rest %q at line start %v", rest, l.AtLineStart())
	}
}
