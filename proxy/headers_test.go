package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// TestHopByHopHeadersDropped: hop-by-hop headers go no further than the
// hop, in either direction, whatever their case, and every other header
// passes with all its values; the upstream's session id never reaches the
// agent, however many copies it sends.
func TestHopByHopHeadersDropped(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got http.Header
	up := startStub(t, nil, func(w http.ResponseWriter, r *http.Request, method string) {
		if method == "tools/call" {
			// The agent's call only: mcpheal's own POSTs (its questions
			// of the upstream's era) do not carry the call's headers, and
			// under load one may come after the call.
			mu.Lock()
			got = r.Header.Clone()
			mu.Unlock()
		}
		h := w.Header()
		h.Set("Keep-Alive", "timeout=9")
		h.Set("Proxy-Connection", "keep-alive")
		h.Set("Upgrade", "h2c")
		h["x-up"] = []string{"1"}
		if r.Header.Get("X-Repeat") != "" {
			h["x-up"] = []string{"1", "2"}
		}
		h.Add("Mcp-Session-Id", "UP-1")
		if r.Header.Get("X-Second-Id") != "" {
			h.Add("mcp-session-id", "UP-1-AGAIN")
		}
		writeJSON(w, json.RawMessage("7"), `{"content":[]}`)
	})
	_, url := startProxy(t, up, nil)
	sid := peers.RawInitialize(t, url)
	for _, c := range []struct{ second, repeat bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
		second := c.second
		want := "1" // the X-Up and X-Custom fields in order
		if c.repeat {
			want = "1,2"
		}
		body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}`
		head := "POST /mcp HTTP/1.1\r\nHost: " + strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://") + "\r\n" +
			"content-type: application/json\r\naccept: application/json, text/event-stream\r\n" +
			"mcp-protocol-version: 2025-11-25\r\nmcp-session-id: " + sid + "\r\n" +
			"keep-alive: 300\r\nproxy-connection: keep-alive\r\nTE: trailers\r\naccept-encoding: gzip\r\n" +
			"Connection: keep-alive\r\nx-custom: 1\r\n"
		if c.repeat {
			// A folded value, and two Cookie fields: both are written
			// again as received.
			head += "X-Custom: 2\r\nx-repeat: 1\r\ncookie: a=1\r\nx-fold: foo\r\n bar\r\nCookie: b=2\r\n"
		}
		if second {
			head += "x-second-id: 1\r\n"
		}
		nc, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(nc, head+"content-length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		nc.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"result"`) {
			t.Fatalf("answer: %d %s", resp.StatusCode, raw)
		}
		for _, h := range []string{"Keep-Alive", "Proxy-Connection", "Upgrade"} {
			if v := resp.Header.Values(h); len(v) > 0 {
				t.Errorf("agent got %s: %q; hop-by-hop headers stop at mcpheal", h, v)
			}
		}
		if v := resp.Header.Values("X-Up"); strings.Join(v, ",") != want {
			t.Errorf("%+v: agent got X-Up %q, want %s", c, v, want)
		}
		if v := resp.Header.Values("Mcp-Session-Id"); len(v) != 1 || v[0] != sid {
			t.Errorf("second copy %v: agent got Mcp-Session-Id %q, want only its own %q", second, v, sid)
		}
		mu.Lock()
		for _, h := range []string{"Keep-Alive", "Proxy-Connection", "Te", "Accept-Encoding"} {
			if v := got.Values(h); len(v) > 0 {
				t.Errorf("upstream got %s: %q; hop-by-hop headers stop at mcpheal", h, v)
			}
		}
		if v := got.Values("X-Custom"); strings.Join(v, ",") != want {
			t.Errorf("%+v: upstream got X-Custom %q, want %s", c, v, want)
		}
		if c.repeat {
			if v := got.Values("Cookie"); strings.Join(v, ",") != "a=1,b=2" {
				t.Errorf("%+v: upstream got Cookie %q, want a=1, b=2 in that order", c, v)
			}
			if v := got.Get("X-Fold"); v != "foo bar" {
				t.Errorf("%+v: upstream got X-Fold %q, want the folded value joined: foo bar", c, v)
			}
		}
		mu.Unlock()
	}
}

// TestRawHeaderNames: the names are found in a header block whatever their
// case, and only as field names; a deletion that could reorder the fields
// of a name that stays (one after the deleted field, repeated) is told.
func TestRawHeaderNames(t *testing.T) {
	t.Parallel()
	names := wire.NewNameSet("Keep-Alive", "TE", "Accept-Encoding")
	type want struct {
		found   uint32
		reorder bool
	}
	many := "TE: 1\r\n"
	for i := range wire.MaxNames + 1 {
		many += "X-" + strconv.Itoa(i) + ": 1\r\n"
	}
	for raw, w := range map[string]want{
		"Host: x\r\nkeep-alive: 1\r\n\r\n":              {1, false},
		"te: trailers\r\nACCEPT-ENCODING: gzip\r\n\r\n": {2 | 4, false},
		"X-Te: 1\r\nX: Keep-Alive: 1\r\n\r\n":           {0, false}, // a value, or a longer name, is no match
		"X: 1\r\n TE: folded continuation\r\n\r\n":      {0, false},
		"Accept-Encoding:gzip\nTe:trailers":             {2 | 4, false}, // bare LF and no final line end
		"":                                              {0, false},
		":\r\n: x\r\n\r\n":                              {0, false},
		"X-A: 1\r\nTE: x\r\nx-a: 2\r\n":                 {2, true},
		"X-A: 1\r\nx-a: 2\r\nTE: x\r\n":                 {2, false}, // deleting the last field moves nothing
		"TE: x\r\nX-A: 1\r\nX-B: 2\r\n":                 {2, false}, // no name that stays repeats
		"TE: 1\r\nte: 2\r\nX: 1\r\n":                    {2, false}, // the deleted names may repeat
		"TE: 1\r\nCookie: a\r\ncookie: b\r\n":           {2, true},  // Cookie fields are kept in order too
		"TE: 1\r\nHost: a\r\nX: 1\r\nhost: b\r\n":       {2, false}, // Host is not in the list
		many: {2, true}, // past maxNames, a repeat is assumed
	} {
		if f, r := wire.RawHeaderNames([]byte(raw), names); f != w.found || r != w.reorder {
			t.Errorf("rawHeaderNames(%q) = %b, %v; want %b, %v", raw, f, r, w.found, w.reorder)
		}
	}
}

// TestNameSetBits: names match ignoring the case of ASCII letters, and
// nothing else is folded.
func TestNameSetBits(t *testing.T) {
	t.Parallel()
	names := wire.NewNameSet("Keep-Alive", "TE", "Mcp-Session-Id")
	for name, want := range map[string]uint32{
		"Keep-Alive": 1, "KEEP-ALIVE": 1, "keep-alive": 1, "kEEP-aLIVE": 1,
		"te": 2, "Te": 2, "MCP-SESSION-ID": 4,
		"Keep\rAlive":     0, // '-' and '\r' differ by the case bit: not folded
		"Keep-Alivf":      0,
		"\u212aeep-Alive": 0, // the Kelvin sign folds to k in Unicode, but is 3 bytes long
		"T":               0,
		"TE ":             0,
		"":                0,
	} {
		if got := names.Bits([]byte(name)); got != want {
			t.Errorf("bits(%q) = %b, want %b", name, got, want)
		}
	}
}

// TestCopyRequestWithoutRawHeaders: a request that was not parsed from the
// wire (RequestCtx.Init) has no raw header block to look in, and still
// loses its hop-by-hop headers.
func TestCopyRequestWithoutRawHeaders(t *testing.T) {
	t.Parallel()
	l := &link.Link{Cfg: &conf.Config{}}
	var ctx fasthttp.RequestCtx
	var r fasthttp.Request
	r.Header.SetMethod(fasthttp.MethodPost)
	r.Header.Set("Keep-Alive", "1")
	r.Header.Set("Accept-Encoding", "gzip")
	r.Header.Set("X-Kept", "1")
	ctx.Init(&r, nil, nil)
	var out fasthttp.Request
	l.CopyRequest(&ctx.Request.Header, ctx.PostBody(), &out)
	if len(out.Header.Peek("Keep-Alive")) > 0 || len(out.Header.Peek("Accept-Encoding")) > 0 {
		t.Fatalf("copied request keeps hop-by-hop headers:\n%s", out.Header.String())
	}
	if string(out.Header.Peek("X-Kept")) != "1" {
		t.Fatalf("copied request lost X-Kept:\n%s", out.Header.String())
	}
}

// BenchmarkStripHeaders: dropping the hop-by-hop fields of an agent's
// request as Go's client sends it (Accept-Encoding last), and of an answer
// head as the TypeScript SDK v1's server sends it (Connection: keep-alive
// among the fields that stay, read off the wire), against deleting every
// name as mcpheal did before (del-each). The header copy is included.
func BenchmarkStripHeaders(b *testing.B) {
	var req fasthttp.Request
	raw := "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 2\r\n" +
		"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n" +
		"Mcp-Protocol-Version: 2025-11-25\r\nMcp-Session-Id: 0123456789abcdef\r\nAccept-Encoding: gzip\r\n\r\n{}"
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	var resp fasthttp.Response
	rawResp := "HTTP/1.1 200 OK\r\ncache-control: no-cache, no-transform\r\nconnection: keep-alive\r\n" +
		"content-type: text/event-stream\r\nmcp-session-id: aea75be1-3040-40b6-acbb-e238a2458d71\r\n" +
		"x-accel-buffering: no\r\nDate: Wed, 25 Nov 2026 00:31:11 GMT\r\nContent-Length: 2\r\n\r\n{}"
	if err := resp.Read(bufio.NewReader(strings.NewReader(rawResp))); err != nil {
		b.Fatal(err)
	}
	var h fasthttp.RequestHeader
	var rh fasthttp.ResponseHeader
	for _, c := range []struct {
		name string
		run  func()
	}{
		{"request/strip", func() {
			req.Header.CopyTo(&h)
			wire.StripRequestHeader(&h, wire.ReqDropHeaders)
		}},
		{"request/del-each", func() {
			req.Header.CopyTo(&h)
			h.ResetConnectionClose()
			for _, n := range wire.ReqDropHeaders.Names {
				h.Del(n)
			}
		}},
		{"response/strip", func() {
			resp.Header.CopyTo(&rh)
			wire.StripResponseHeader(&resp.Header, &rh, true)
		}},
		{"response/del-each", func() {
			resp.Header.CopyTo(&rh)
			rh.ResetConnectionClose()
			for _, n := range wire.RespDropHeaders.Names {
				rh.Del(n)
			}
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.run()
			}
		})
	}
}

// TestUpcallKeepsFieldOrder: the requests mcpheal makes for the agent (a
// heal's initialize, a stream reopened, a keepalive) carry the agent's
// fields without the hop-by-hop ones and those the request sets itself,
// and fields of one name keep their order: from a header as parsed, one
// changed since (a session id set on it), and one built with Add.
func TestUpcallKeepsFieldOrder(t *testing.T) {
	t.Parallel()
	parsed := func(t *testing.T) *fasthttp.RequestHeader {
		var h fasthttp.RequestHeader
		raw := "GET /mcp HTTP/1.1\r\nHost: h\r\nAccept: application/json\r\nX-A: 1\r\nKeep-Alive: 5\r\n" +
			"X-B: 0\r\nCookie: c=1\r\nX-A: 2\r\nCookie: d=2\r\n\r\n"
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatal(err)
		}
		return &h
	}
	changed := func(t *testing.T) *fasthttp.RequestHeader {
		h := parsed(t)
		h.SetBytesK(wire.HdrSessionID, "upstream-id") // as setSessionHeader does
		return h
	}
	added := func(*testing.T) *fasthttp.RequestHeader {
		h := new(fasthttp.RequestHeader)
		for _, kv := range [][2]string{{"Keep-Alive", "5"}, {"X-A", "1"}, {"Mcp-Method", "x"}, {"X-B", "0"}, {"X-A", "2"}} {
			h.Add(kv[0], kv[1])
		}
		return h
	}
	l := &link.Link{Cfg: &conf.Config{}}
	for name, agent := range map[string]func(*testing.T) *fasthttp.RequestHeader{
		"parsed": parsed, "changed": changed, "added": added,
	} {
		t.Run(name, func(t *testing.T) {
			var req fasthttp.Request
			l.Build(&req, &link.Upcall{Hdr: agent(t), Method: fasthttp.MethodGet})
			h := &req.Header
			if got := h.PeekAll("X-A"); len(got) != 2 || string(got[0]) != "1" || string(got[1]) != "2" {
				t.Errorf("X-A fields %q, want 1 then 2:\n%s", got, h.String())
			}
			for _, gone := range []string{"Keep-Alive", "Mcp-Session-Id", "Mcp-Method"} {
				if len(h.Peek(gone)) > 0 {
					t.Errorf("%s reached the upcall:\n%s", gone, h.String())
				}
			}
			if string(h.Peek("Accept")) != "text/event-stream" || string(h.Peek("X-B")) != "0" {
				t.Errorf("Accept or X-B wrong:\n%s", h.String())
			}
			if name != "added" && (string(h.Cookie("c")) != "1" || string(h.Cookie("d")) != "2") {
				t.Errorf("cookies lost:\n%s", h.String())
			}
		})
	}
	// A header with no raw block, stripped of hop-by-hop fields only.
	h := added(t)
	wire.StripRequestHeader(h, wire.ReqDropHeaders)
	if got := h.PeekAll("X-A"); len(got) != 2 || string(got[0]) != "1" || string(got[1]) != "2" || len(h.Peek("Keep-Alive")) > 0 {
		t.Errorf("stripRequestHeader without a raw block: X-A %q:\n%s", got, h.String())
	}
}
