package bench

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// The held route (docs/eras.md "Across protocol eras"): an MCP 2026-07-28
// agent's call to an upstream of the session era, which mcpheal makes on a
// session it holds for the agent, beside a session-era agent's call to the
// same upstream through mcpheal, and the same call made directly.

// heldUpstream is a fasthttp MCP server of the session era only: it
// refuses server/discover (400), answers initialize with a session id,
// and answers tools/call with a fixed text under the request's id. It
// allocates nothing per request.
func heldUpstream(ctx *fasthttp.RequestCtx) {
	body := ctx.PostBody()
	s := unsafe.String(unsafe.SliceData(body), len(body))
	switch gjson.Get(s, "method").Str {
	case "initialize":
		ctx.Response.Header.Set("Mcp-Session-Id", "held-session")
		ctx.Response.Header.SetContentTypeBytes(ctJSON)
		ctx.Response.SetBodyRaw(fakeInit)
		return
	case "tools/call":
	case "server/discover":
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.Response.Header.SetContentTypeBytes(ctJSON)
		ctx.Response.SetBodyString(`{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Server not initialized"}}`)
		return
	default:
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		return
	}
	ctx.Response.Header.SetContentTypeBytes(ctJSON)
	ctx.Response.AppendBodyString(`{"jsonrpc":"2.0","id":`)
	ctx.Response.AppendBodyString(gjson.Get(s, "id").Raw)
	ctx.Response.AppendBodyString(`,"result":{"content":[{"type":"text","text":"held-bench"}]}}`)
}

// heldMeta is the 2026-07-28 envelope of every held request.
const heldMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
	`"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`

// heldCaller sends one kind of call and checks its answer.
type heldCaller struct {
	hc      *fasthttp.HostClient
	modern  bool   // a 2026-07-28 agent: no session, the envelope in _meta
	sid     string // the session-era agent's session
	req     *fasthttp.Request
	resp    *fasthttp.Response
	body    []byte
	want    []byte
	counter uint64
}

func newHeldCaller(tb testing.TB, addr string, modern bool) *heldCaller {
	tb.Helper()
	c := &heldCaller{hc: &fasthttp.HostClient{Addr: addr}, modern: modern,
		req: fasthttp.AcquireRequest(), resp: fasthttp.AcquireResponse()}
	tb.Cleanup(func() {
		fasthttp.ReleaseRequest(c.req)
		fasthttp.ReleaseResponse(c.resp)
	})
	c.req.SetRequestURI("http://" + addr + "/mcp")
	c.req.Header.SetMethod(fasthttp.MethodPost)
	c.req.Header.SetContentTypeBytes(ctJSON)
	c.req.Header.Set("Accept", "application/json, text/event-stream")
	if modern {
		c.req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		c.req.Header.Set("Mcp-Method", "tools/call")
		c.req.Header.Set("Mcp-Name", "echo")
		return c
	}
	c.req.SetBody(initBody)
	if err := c.hc.Do(c.req, c.resp); err != nil || c.resp.StatusCode() != fasthttp.StatusOK {
		tb.Fatalf("initialize via %s: %v, status %d", addr, err, c.resp.StatusCode())
	}
	c.sid = string(c.resp.Header.Peek("Mcp-Session-Id"))
	c.req.Header.Set("Mcp-Session-Id", c.sid)
	c.req.Header.Set("Mcp-Protocol-Version", ProtocolVersion)
	return c
}

// call makes one tools/call and checks the answer: the agent's id, and,
// for a 2026-07-28 agent, its resultType.
func (c *heldCaller) call() error {
	c.counter++
	id := c.counter
	c.body = append(c.body[:0], `{"jsonrpc":"2.0","id":`...)
	c.body = strconv.AppendUint(c.body, id, 10)
	c.body = append(c.body, `,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}`...)
	if c.modern {
		c.body = append(c.body, ',')
		c.body = append(c.body, heldMeta...)
	}
	c.body = append(c.body, "}}"...)
	c.req.SetBodyRaw(c.body)
	if err := c.hc.Do(c.req, c.resp); err != nil {
		return err
	}
	c.want = append(c.want[:0], `"id":`...)
	c.want = strconv.AppendUint(c.want, id, 10)
	b := c.resp.Body()
	if c.resp.StatusCode() != fasthttp.StatusOK || !bytes.Contains(b, c.want) || !bytes.Contains(b, []byte("held-bench")) ||
		c.modern && !bytes.Contains(b, []byte(`"resultType":"complete"`)) {
		return fmt.Errorf("call %d: status %d body %.300s", id, c.resp.StatusCode(), b)
	}
	return nil
}

// BenchmarkHeldCall measures one tools/call at concurrency 1: direct (a
// session-era agent to the upstream), through mcpheal by a session-era
// agent (session), and through mcpheal by a 2026-07-28 agent on a session
// mcpheal holds (held). allocs/op counts the whole process: the held
// route's own cost is its figure minus the session one.
func BenchmarkHeldCall(b *testing.B) {
	up := serveLoopback(b, heldUpstream)
	for _, target := range []string{"direct", "session", "held"} {
		b.Run(target, func(b *testing.B) {
			addr := up
			if target != "direct" {
				addr = proxyAddr(b, up)
			}
			c := newHeldCaller(b, addr, target == "held")
			for range 10 { // warm the pools and the held session
				if err := c.call(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := c.call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestHeldCallSetup runs a few calls of each case of BenchmarkHeldCall, so
// that its plumbing is tested (quickly, under -race) in CI.
func TestHeldCallSetup(t *testing.T) {
	t.Parallel()
	up := serveLoopback(t, heldUpstream)
	for _, target := range []string{"session", "held"} {
		c := newHeldCaller(t, proxyAddr(t, up), target == "held")
		for range 5 {
			if err := c.call(); err != nil {
				t.Fatalf("%s: %v", target, err)
			}
		}
	}
}
