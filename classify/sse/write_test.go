package sse

import (
	"bytes"
	"testing"
)

// TestAppendEventRoundTrip writes data holding every kind of line end and
// reads it back through the Framer: the reader's data is the written data
// with each line end as LF, whatever pieces the stream arrives in.
func TestAppendEventRoundTrip(t *testing.T) {
	cases := []struct {
		name, data, want string
	}{
		{"one line", `{"jsonrpc":"2.0","id":1,"result":{}}`, `{"jsonrpc":"2.0","id":1,"result":{}}`},
		{"empty", "", ""},
		{"LF", "{\n\"a\": 1\n}", "{\n\"a\": 1\n}"},
		{"CRLF", "{\r\n\"a\": 1\r\n}", "{\n\"a\": 1\n}"},
		{"lone CR", "{\r\"a\": 1\r}", "{\n\"a\": 1\n}"},
		{"trailing LF", "x\n", "x\n"},
		{"blank line inside", "a\n\nb", "a\n\nb"},
		{"field-like text", "data: x\nevent: y\n: z", "data: x\nevent: y\n: z"},
	}
	for _, c := range cases {
		ev := AppendEvent(nil, "message", []byte(c.data))
		for _, step := range []int{1, 2, 3, len(ev)} {
			var f Framer
			var got []byte
			n := 0
			for off := 0; off < len(ev); off += step {
				f.Feed(ev[off:min(off+step, len(ev))])
				for {
					e, ok, err := f.Next()
					if err != nil {
						t.Fatalf("%s: %v", c.name, err)
					}
					if !ok {
						break
					}
					n++
					got = Data(nil, e)
				}
			}
			if n != 1 {
				t.Fatalf("%s (reads of %d): %d events from %q, want 1", c.name, step, n, ev)
			}
			if string(got) != c.want {
				t.Errorf("%s (reads of %d): data %q, want %q", c.name, step, got, c.want)
			}
		}
	}
}

func TestAppendEventFields(t *testing.T) {
	got := string(AppendEvent(nil, "", []byte("a\nb")))
	if want := "data: a\ndata: b\n\n"; got != want {
		t.Errorf("AppendEvent without a name = %q, want %q", got, want)
	}
	got = string(AppendEvent([]byte("x"), "message", []byte("{}")))
	if want := "xevent: message\ndata: {}\n\n"; got != want {
		t.Errorf("AppendEvent = %q, want %q", got, want)
	}
	if got := string(AppendComment(nil, "keepalive")); got != ": keepalive\n\n" {
		t.Errorf("AppendComment = %q", got)
	}
	if got := string(AppendField(nil, "id", []byte("2-7"))); got != "id: 2-7\n" {
		t.Errorf("AppendField = %q", got)
	}
}

func TestAppendEventAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	data := bytes.Repeat([]byte("x\n"), 10)
	if n := testing.AllocsPerRun(100, func() { buf = AppendEvent(buf[:0], "message", data) }); n != 0 {
		t.Errorf("AppendEvent into a large enough buffer: %v allocs, want 0", n)
	}
}

func FuzzAppendEvent(f *testing.F) {
	f.Add([]byte("{\"a\":1}"))
	f.Add([]byte("a\r\nb\rc\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev := AppendEvent(nil, "message", data)
		var fr Framer
		fr.Feed(ev)
		e, ok, err := fr.Next()
		if err != nil || !ok {
			t.Fatalf("AppendEvent(%q) = %q: not one complete event", data, ev)
		}
		if rest := fr.Rest(); len(rest) != 0 {
			t.Fatalf("AppendEvent(%q) = %q: %q after the event", data, ev, rest)
		}
		want := bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
		if got := Data(nil, e); !bytes.Equal(got, want) {
			t.Fatalf("AppendEvent(%q): read back %q, want %q", data, got, want)
		}
	})
}
