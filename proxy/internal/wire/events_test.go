package wire

import (
	"bytes"
	"strings"
	"testing"
)

// rewriteAll relays in through the line relay in pieces of every size
// from 1 to 7 bytes and checks that each gives the same output.
func rewriteAll(t *testing.T, gen uint64, in string) string {
	t.Helper()
	var first string
	for size := 1; size <= 7; size++ {
		er := EventRewriter{Gen: gen}
		var out []byte
		for i := 0; i < len(in); i += size {
			res, aliased, err := er.Stream(nil, []byte(in[i:min(i+size, len(in))]))
			if err != nil {
				t.Fatal(err)
			}
			_ = aliased
			out = append(out, res...)
		}
		if size == 1 {
			first = string(out)
		} else if string(out) != first {
			t.Fatalf("pieces of %d: %q, pieces of 1: %q", size, out, first)
		}
	}
	return first
}

func TestEventRewriter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		gen  uint64
		in   string
		want string
	}{
		{"gen 1 untouched", 1, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"sampling/createMessage\"}\n\n",
			"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"sampling/createMessage\"}\n\n"},
		{"event ids qualified", 1, "id: abc_1\ndata: \n\nid: abc_2\ndata: {\"x\":1}\n\n",
			"id: 1-abc_1\ndata: \n\nid: 1-abc_2\ndata: {\"x\":1}\n\n"},
		{"gen 2 number id", 2, "data: {\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"roots/list\"}\r\n\r\n",
			"data: {\"jsonrpc\":\"2.0\",\"id\":\"mcpheal-g2-n0\",\"method\":\"roots/list\"}\r\n\r\n"},
		{"gen 3 string id", 3, "data: {\"id\":\"r-1\",\"method\":\"elicitation/create\"}\n\n",
			"data: {\"id\":\"mcpheal-g3-sr-1\",\"method\":\"elicitation/create\"}\n\n"},
		{"gen 2 notification and response untouched", 2, "data: {\"method\":\"notifications/progress\"}\n\ndata: {\"id\":4,\"result\":{}}\n\n",
			"data: {\"method\":\"notifications/progress\"}\n\ndata: {\"id\":4,\"result\":{}}\n\n"},
		{"partial data line passes", 1, "data: {}\n\ndata: {\"part", "data: {}\n\ndata: {\"part"},
		{"partial id line held", 1, "data: {}\n\nid: 12", "data: {}\n\n"},
		{"split CRLF", 2, "id: a\r\ndata: {\"id\":1,\"method\":\"roots/list\"}\r\n\r\n",
			"id: 2-a\r\ndata: {\"id\":\"mcpheal-g2-n1\",\"method\":\"roots/list\"}\r\n\r\n"},
	}
	for _, tt := range tests {
		if got := rewriteAll(t, tt.gen, tt.in); got != tt.want {
			t.Errorf("%s: rewrite = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestEventRewriterState(t *testing.T) {
	t.Parallel()
	er := EventRewriter{Gen: 4}
	_, _, _ = er.Stream(nil, []byte("retry: 1500\nid: e7\ndata: {}\n\n"))
	if er.LastID != "e7" || er.RetryMs != 1500 {
		t.Fatalf("lastID %q retry %d, want e7 1500", er.LastID, er.RetryMs)
	}
}

func TestAnswerRoute(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body string
		gen  uint64
		want string
		ok   bool
	}{
		{`{"jsonrpc":"2.0","id":5,"result":{}}`, 1, "", true},  // unchanged
		{`{"jsonrpc":"2.0","id":5,"result":{}}`, 2, "", false}, // a gen-1 request, session re-created since
		{`{"jsonrpc":"2.0","id":"mcpheal-g2-n5","result":{}}`, 2, `{"jsonrpc":"2.0","id":5,"result":{}}`, true},
		{`{"jsonrpc":"2.0","id":"mcpheal-g2-sab\"c","result":{}}`, 2, `{"jsonrpc":"2.0","id":"ab\"c","result":{}}`, true},
		{`{"jsonrpc":"2.0","id":"mcpheal-g2-n5","result":{}}`, 3, "", false},
	}
	for _, tt := range tests {
		m := ParseMessage([]byte(tt.body))
		got, ok := AnswerRoute([]byte(tt.body), m.ID, tt.gen)
		if ok != tt.ok || ok && string(got) != tt.want {
			t.Errorf("answerRoute(%s, gen %d) = %s, %v; want %s, %v", tt.body, tt.gen, got, ok, tt.want, tt.ok)
		}
	}
	// Round trip: what the rewriter sends is what answerRoute restores.
	nv, _ := namespaceRequestID([]byte(`{"id":"x\u00e9","method":"m"}`), 7)
	resp := bytes.Replace(nv, []byte(`"method":"m"`), []byte(`"result":{}`), 1)
	m := ParseMessage(resp)
	back, ok := AnswerRoute(resp, m.ID, 7)
	if !ok || string(back) != `{"id":"xé","result":{}}` {
		t.Fatalf("round trip = %s, %v", back, ok)
	}
}

func TestUpstreamEventID(t *testing.T) {
	t.Parallel()
	if got := UpstreamEventID([]byte("3-abc-1"), 3); got != "abc-1" {
		t.Fatalf("same generation: %q", got)
	}
	if got := UpstreamEventID([]byte("2-abc"), 3); got != "" {
		t.Fatalf("old generation: %q, want dropped", got)
	}
}

// FuzzRelay: the line relay gives the same bytes whatever the read sizes;
// in generation 1 it leaves a stream with no id or retry field untouched;
// with mcpheal's own ids, every id the agent gets is one of them.
func FuzzRelay(f *testing.F) {
	for _, s := range []string{"data: {}\n\n", "id: 1\r\ndata: x\r\n\r\n", "retry: 5\rdata: {\"id\":1,\"method\":\"m\"}\r\r", "da", ": c\n",
		"id: 9\ndata: \n\nretry: 3\n\ndata: {\"a\":1}\n\n"} {
		f.Add(s, uint8(3), uint8(1))
		f.Add(s, uint8(5), uint8(3))
	}
	f.Fuzz(func(t *testing.T, s string, cut, gen uint8) {
		g, own := uint64(gen%3)+1, uint64(gen/3%2)*7
		relay := func(pieces ...string) string {
			er := EventRewriter{Gen: g, Own: own}
			var out []byte
			for _, p := range pieces {
				res, _, err := er.Stream(nil, []byte(p))
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, res...)
			}
			out, _ = er.EndStream(out, true)
			return string(out)
		}
		whole := relay(s)
		if len(s) > 0 {
			c := int(cut) % len(s)
			if got := relay(s[:c], s[c:]); got != whole {
				t.Fatalf("cut at %d: %q, whole: %q", c, got, whole)
			}
		}
		if g == 1 && own == 0 && !strings.Contains(s, "id") && !strings.Contains(s, "retry") && whole != s {
			t.Fatalf("generation 1 changed a stream with no id or retry: %q -> %q", s, whole)
		}
		if own != 0 {
			// An unfinished last line never reaches an agent's parser.
			complete := whole[:strings.LastIndexAny(whole, "\r\n")+1]
			for _, l := range strings.FieldsFunc(complete, func(r rune) bool { return r == '\n' || r == '\r' }) {
				if name, _, _ := strings.Cut(l, ":"); name == "id" && !strings.HasPrefix(l, "id: m7-") {
					t.Fatalf("with own ids the agent got %q in %q", l, whole)
				}
			}
		}
	})
}

// TestRelayPassesLargeResponsesAfterHeal: from generation 2 data lines are
// looked at to renumber server→client requests, but a response passes once
// its head shows it is one: a large tool result after a heal is neither
// held whole nor cut at max_sse_line.
func TestRelayPassesLargeResponsesAfterHeal(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("r", 1<<20)
	in := "data: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"text\":\"" + big + "\"}}\n\n"
	er := EventRewriter{Gen: 2, Max: 64 << 10}
	var out []byte
	for i := 0; i < len(in); i += 16 << 10 {
		res, _, err := er.Stream(nil, []byte(in[i:min(i+16<<10, len(in))]))
		if err != nil {
			t.Fatalf("at %d: %v", i, err)
		}
		out = append(out, res...)
		if len(er.Held) > headLen+16<<10 {
			t.Fatalf("held %d bytes of a response", len(er.Held))
		}
	}
	if string(out) != in {
		t.Fatal("the response was changed")
	}
	// A request from generation 2 is still renumbered.
	er = EventRewriter{Gen: 2, Max: 64 << 10}
	res, _, _ := er.Stream(nil, []byte("data: {\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"sampling/createMessage\",\"params\":{}}\n\n"))
	if !strings.Contains(string(res), `"mcpheal-g2-n4"`) {
		t.Fatalf("request not renumbered: %q", res)
	}
}
