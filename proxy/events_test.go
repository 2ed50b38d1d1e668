package proxy

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func rewriteAll(t *testing.T, gen uint64, in string) string {
	t.Helper()
	er := eventRewriter{gen: gen}
	var out []byte
	r := iotest.OneByteReader(strings.NewReader(in))
	buf := make([]byte, 1)
	for {
		n, err := r.Read(buf)
		out = er.feed(out, buf[:n])
		if err == io.EOF {
			break
		}
	}
	return string(out)
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
		{"partial tail held", 1, "data: {}\n\ndata: {\"part", "data: {}\n\n"},
	}
	for _, tt := range tests {
		if got := rewriteAll(t, tt.gen, tt.in); got != tt.want {
			t.Errorf("%s: rewrite = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestEventRewriterState(t *testing.T) {
	t.Parallel()
	er := eventRewriter{gen: 4}
	er.feed(nil, []byte("retry: 1500\nid: e7\ndata: {}\n\n"))
	if er.lastID != "e7" || er.retryMs != 1500 {
		t.Fatalf("lastID %q retry %d, want e7 1500", er.lastID, er.retryMs)
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
		m := parseMessage([]byte(tt.body))
		got, ok := answerRoute([]byte(tt.body), m.id, tt.gen)
		if ok != tt.ok || ok && string(got) != tt.want {
			t.Errorf("answerRoute(%s, gen %d) = %s, %v; want %s, %v", tt.body, tt.gen, got, ok, tt.want, tt.ok)
		}
	}
	// Round trip: what the rewriter sends is what answerRoute restores.
	nv, _ := namespaceRequestID([]byte(`{"id":"x\u00e9","method":"m"}`), 7)
	resp := bytes.Replace(nv, []byte(`"method":"m"`), []byte(`"result":{}`), 1)
	m := parseMessage(resp)
	back, ok := answerRoute(resp, m.id, 7)
	if !ok || string(back) != `{"id":"xé","result":{}}` {
		t.Fatalf("round trip = %s, %v", back, ok)
	}
}

func TestUpstreamEventID(t *testing.T) {
	t.Parallel()
	if got := upstreamEventID([]byte("3-abc-1"), 3); got != "abc-1" {
		t.Fatalf("same generation: %q", got)
	}
	if got := upstreamEventID([]byte("2-abc"), 3); got != "" {
		t.Fatalf("old generation: %q, want dropped", got)
	}
}
