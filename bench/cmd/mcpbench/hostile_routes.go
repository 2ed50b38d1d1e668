package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/bench"
)

// The routes beside a session-era agent's calls where an upstream can make
// mcpheal hold what it sends whole (docs/security.md "Under attack"): the
// OAuth metadata documents mcpheal forwards, the events the held route
// (2026-07-28 agents of a session-era server) reads and translates, and
// a server→client request mcpheal renumbers after a heal. Each is counted
// in memory_budget; these attacks send enough that it must be.

// maxMetadata is mcpheal's cap on an OAuth metadata document it forwards
// (proxy.maxMetadata): larger ones are refused with 502.
const maxMetadata = 64 << 10

// freeHold is what an answer stream may hold whole without counting it
// (proxy.freeHold): its read buffer's size.
const freeHold = 64 << 10

// 15. OAuth metadata: 40 agents that read slowly ask mcpheal for the
// protected resource metadata, which the upstream makes 30 MiB.
func (h *harness) attackWellKnown() hostileAttack {
	const readers, wait = 40, 10 * time.Second
	size := hostileMetadata
	// What mcpheal holds beyond its budget: per reader, a document of at
	// most maxMetadata rewritten to name mcpheal as the resource.
	uncounted := readers * 2 * maxMetadata
	why := fmt.Sprintf("%d documents of at most %s and their rewritten copies", readers, mib(maxMetadata))
	var conns []slowConn
	return hostileAttack{
		name: "OAuth metadata",
		sends: fmt.Sprintf("%d raw TCP agents (4 KiB receive buffer) GET %s one after the other and read nothing until the upstream has been asked for all (at most %s), then read; the upstream's document is %s, with Content-Length",
			readers, prmAgentPath, wait, mib(size)),
		cap: fmt.Sprintf("a metadata document is at most %s (502 beyond) and counted in memory_budget while read and until written (-32017 past it); the route takes the guard's Host and Origin check", mib(maxMetadata)),
		setup: func(ctx context.Context, a *attackRun) error {
			conns = nil
			return nil
		},
		run: func(ctx context.Context, a *attackRun) error {
			defer func() {
				for _, c := range conns {
					if c.c != nil {
						_ = c.c.Close()
					}
				}
			}()
			// One agent after the other, each once the upstream was asked for
			// its document (at most 2 s), so that a build holding them
			// whole can be stopped at floodRSSGuard.
			req := "GET " + prmAgentPath + " HTTP/1.1\r\nHost: " + a.addr + "\r\nAccept: application/json\r\n\r\n"
			stopped := ""
			for i := range readers {
				if a.rssKB() > floodRSSGuard>>10 {
					stopped = fmt.Sprintf("; %d agents sent, stopped when mcpheal's RSS passed %s", i, mib(floodRSSGuard))
					break
				}
				c, err := dialSmallWindow(ctx, a.addr)
				if err == nil {
					_, err = io.WriteString(c, req)
				}
				conns = append(conns, slowConn{c: c, err: err})
				if _, err := a.waitUpstream(ctx, 2*time.Second, func(st hostileStats) bool { return st.WellKnowns-a.stats.WellKnowns > int64(i) }); err != nil {
					return err
				}
			}
			asked, err := a.waitUpstream(ctx, wait, func(st hostileStats) bool { return st.WellKnowns-a.stats.WellKnowns >= int64(len(conns)) })
			if err != nil {
				return err
			}
			a.note("the upstream was asked for the document %d times", asked.WellKnowns-a.stats.WellKnowns)
			if err := sleepCtx(ctx, time.Second); err != nil {
				return err
			}
			a.note("while the agents did not read (1 s later): RSS %.1f MB, %d sockets open", mb(a.rssKB()), a.sockets())
			var t tally
			var mu sync.Mutex
			served, refused := 0, 0
			own := `{"resource":"http://` + a.addr + `/mcp"`
			deadline := time.Now().Add(30 * time.Second)
			parallel(len(conns), len(conns), func(i int) {
				c := conns[i]
				if c.err != nil {
					t.add("no connection ("+shortErr(c.err)+")", "")
					return
				}
				x, head := readDocument(c.c, deadline)
				key := x.key()
				ok := false
				switch {
				case x.err != nil:
				case x.status == http.StatusOK:
					// Served: the upstream's document whole, naming mcpheal.
					ok = x.n > int64(size) && bytes.HasPrefix(head, []byte(own))
					if !ok {
						key += fmt.Sprintf(", %s not naming mcpheal's URL first", mib(int(x.n)))
					}
				case x.status == http.StatusBadGateway && x.code == -32016 && strings.Contains(x.msg, strconv.Itoa(maxMetadata)),
					x.status == http.StatusServiceUnavailable && x.code == -32017 && strings.Contains(x.msg, "memory_budget"):
					ok = true
				}
				t.add(key, x.msg)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case ok && x.status == http.StatusOK:
					served++
				case ok:
					refused++
				}
			})
			a.got(&t, stopped)
			a.check(served+refused == readers, "every agent got the document whole naming mcpheal as the resource (%d) or a refusal naming its %s cap or memory_budget (%d), of %d",
				served, mib(maxMetadata), refused, readers)
			a.newcomer(ctx, "after the attack")
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			a.peakWithin(uncounted, why)
			a.budgetBack(ctx)
			return nil
		},
	}
}

// prmAgentPath is where an agent of mcpheal's /mcp finds its protected
// resource metadata (RFC 9728).
const prmAgentPath = "/.well-known/oauth-protected-resource/mcp"

// readDocument reads a slow agent's answer once it starts reading: the
// status, the body's length and its first 512 bytes, and an error answer's
// JSON-RPC code and message.
func readDocument(c net.Conn, deadline time.Time) (x agentAnswer, head []byte) {
	_ = c.SetReadDeadline(deadline)
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64<<10), nil)
	if err != nil {
		return agentAnswer{err: err}, nil
	}
	defer resp.Body.Close()
	x.status = resp.StatusCode
	head, err = io.ReadAll(io.LimitReader(resp.Body, 512))
	n, err2 := io.Copy(io.Discard, resp.Body)
	x.n = int64(len(head)) + n
	if err == nil {
		err = err2
	}
	if err != nil {
		x.err = err
		return x, head
	}
	if x.status != http.StatusOK {
		x.code, x.msg = gjson.GetBytes(head, "error.code").Int(), gjson.GetBytes(head, "error.message").Str
	}
	return x, head
}

// waitUpstream polls the upstream's counters until done says so or wait
// passes, and returns the last ones.
func (a *attackRun) waitUpstream(ctx context.Context, wait time.Duration, done func(hostileStats) bool) (hostileStats, error) {
	for deadline := time.Now().Add(wait); ; {
		st, err := a.upStats(ctx)
		if err != nil || done(st) || time.Now().After(deadline) {
			return st, err
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return st, err
		}
	}
}

// budgetBack notes what mcpheal counts in memory_budget once the attack is
// over, and checks that a pass with a budget got it back: what is left is
// the sessions' own (a few KiB each).
func (a *attackRun) budgetBack(ctx context.Context) {
	v, err := a.metricWhere(ctx, "mcpheal_memory_budget_bytes", `kind="used"`)
	if err != nil {
		a.note("memory_budget used: %v", err)
		return
	}
	a.check(v < 1<<20, "2 s after the attack memory_budget counts %s (the charges came back)", mib(int(v)))
}

// streamAnswer is what an agent read of an SSE (or JSON) answer.
type streamAnswer struct {
	status int
	n      int64  // body bytes
	head   []byte // the first 512 bytes of the body
	last   gjson.Result
	err    error
}

// result is the text of the last message's result, "" for none.
func (x streamAnswer) result() string { return x.last.Get("result.content.0.text").Str }

// key is the answer as the tally counts it: "200, last event -32017",
// "200, result done".
func (x streamAnswer) key() string {
	switch {
	case x.err != nil:
		return "no answer (" + shortErr(x.err) + ")"
	case x.last.Get("error.code").Int() != 0:
		return fmt.Sprintf("%d, last message %d", x.status, x.last.Get("error.code").Int())
	case x.result() != "":
		return fmt.Sprintf("%d, result %q", x.status, x.result())
	}
	return fmt.Sprintf("%d, no answer message", x.status)
}

// readStream reads an answer to its end: its length, its first bytes and
// its last JSON-RPC message (the last data: line of an SSE answer).
func readStream(resp *http.Response) streamAnswer {
	x := streamAnswer{status: resp.StatusCode}
	buf := make([]byte, 64<<10)
	keep := make([]byte, 0, 128<<10)
	for {
		k, err := resp.Body.Read(buf)
		if len(x.head) < 512 {
			x.head = append(x.head, buf[:min(k, 512-len(x.head))]...)
		}
		x.n += int64(k)
		keep = append(keep, buf[:k]...)
		if len(keep) > 64<<10 {
			keep = append(keep[:0], keep[len(keep)-64<<10:]...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			x.err = err
			return x
		}
	}
	x.last = lastMessage(keep, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
	return x
}

// lastMessage is the last JSON-RPC message of the end of an answer: its
// last data: line when it is SSE, else all of it.
func lastMessage(tail []byte, sse bool) gjson.Result {
	if !sse {
		return gjson.ParseBytes(bytes.TrimSpace(tail))
	}
	for end := len(tail); end > 0; {
		i := bytes.LastIndex(tail[:end], []byte("data:"))
		if i < 0 {
			break
		}
		if i == 0 || tail[i-1] == '\n' || tail[i-1] == '\r' {
			line := tail[i+len("data:"):]
			if j := bytes.IndexAny(line, "\r\n"); j >= 0 {
				line = line[:j]
			}
			return gjson.ParseBytes(bytes.TrimSpace(line))
		}
		end = i
	}
	return gjson.Result{}
}

// heldCallBody is a 2026-07-28 agent's tools/call (no session: the
// protocol version, client and capabilities in its _meta, as
// proxy/held_test.go's heldPost has them), asking for progress.
func heldCallBody(id int, tool, args string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args +
		`,"_meta":{"progressToken":` + strconv.Itoa(id) + `,"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"held-agent","version":"1"},"io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}}}`)
}

// callStream posts body as an agent, with hdr, and reads the answer to its
// end.
func (a *attackRun) callStream(ctx context.Context, hdr http.Header, body []byte) streamAnswer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return streamAnswer{err: err}
	}
	req.Header = hdr.Clone()
	resp, err := a.hc.Do(req)
	if err != nil {
		return streamAnswer{err: err}
	}
	defer resp.Body.Close()
	return readStream(resp)
}

// heldHeader is what a 2026-07-28 agent's tools/call of tool carries.
func heldHeader(tool string) http.Header {
	return http.Header{
		"Content-Type":         {"application/json"},
		"Accept":               {"application/json, text/event-stream"},
		"Mcp-Protocol-Version": {modernVersion},
		"Mcp-Method":           {"tools/call"},
		"Mcp-Name":             {tool},
	}
}

// bigEventAttack is the shape of the two attacks below: calls concurrent
// tools/call of tool, each answered with one large event of size bytes
// that the upstream holds its answer after for hold; a call whose event
// mcpheal held must end with its result, one it could not hold within
// memory_budget with -32017. Then, the attack over, one call alone must
// get its event whole and its result.
type bigEventAttack struct {
	calls, size int
	// copies is how many times its size an event held costs in the
	// budget at least: as read and as passed on (and, on the held route,
	// its copy for the translation).
	copies int
	hold   time.Duration
	tool   string
	hdr    func() http.Header
	body   func(id int, tool, args string) []byte
	// whole says whether what an agent read carries the event whole, as
	// the route must pass it on.
	whole func(x streamAnswer) bool
}

func (b bigEventAttack) args() string {
	return fmt.Sprintf(`{"bytes":%d,"hold_ms":%d}`, b.size, b.hold.Milliseconds())
}

// run sends the calls and checks what they got.
func (b bigEventAttack) run(ctx context.Context, a *attackRun) {
	var t tally
	var mu sync.Mutex
	done, refused, whole := 0, 0, 0
	start := time.Now()
	var refusedLast time.Duration
	parallel(b.calls, b.calls, func(i int) {
		x := a.callStream(ctx, b.hdr(), b.body(100+i, b.tool, b.args()))
		t.add(x.key(), x.last.Get("error.message").Str)
		mu.Lock()
		defer mu.Unlock()
		switch code := x.last.Get("error.code").Int(); {
		case x.err == nil && x.status == http.StatusOK && x.result() == "done":
			done++
			if b.whole(x) {
				whole++
			}
		case x.err == nil && x.status == http.StatusOK && code == -32017 && strings.Contains(x.last.Get("error.message").Str, "memory_budget"):
			refused++
			refusedLast = max(refusedLast, time.Since(start))
		}
	})
	a.got(&t, "")
	fit := a.pass.Budget / (b.copies * b.size)
	a.check(done+refused == b.calls, "every call got its result (%d) or -32017 naming memory_budget (%d), of %d", done, refused, b.calls)
	a.check(done <= max(fit, 1), "%d calls got their result with the event held, at most the %d events × %d that fit in memory_budget %s", done, fit, b.copies, mib(a.pass.Budget))
	a.check(whole == done, "%d of the %d results came after the event whole", whole, done)
	if refused > 0 {
		a.check(refusedLast < b.hold, "the refused calls were answered at once (the last after %s), not after the upstream's %s", refusedLast.Round(time.Millisecond), b.hold)
	}
}

// after checks the peak, and that the upstream ran the tool once per
// call, then that one call alone gets its event whole and its result.
//
// What mcpheal holds beyond its budget: per call, its read buffer and the
// 64 KiB of an event it holds before counting; and the buffers an event
// outgrew. A held event grows by doubling and is counted as it grows, at
// least twice its buffer's size: the smaller buffers it left behind,
// freed but not yet collected or returned, are at most its size again,
// half the budget at most.
func (b bigEventAttack) after(ctx context.Context, a *attackRun) error {
	a.peakWithin(b.calls*2*freeHold+a.pass.Budget/2,
		fmt.Sprintf("%d calls × (a read buffer + %s held free), and the buffers the events outgrew as they were read, half the budget at most", b.calls, mib(freeHold)))
	st, err := a.upStats(ctx)
	if err != nil {
		return err
	}
	ran := st.Calls[b.tool] - a.stats.Calls[b.tool]
	a.check(ran == int64(b.calls), "the upstream ran `%s` %d times for %d calls (none sent again)", b.tool, ran, b.calls)
	one := b
	one.hold = 0
	x := a.callStream(ctx, b.hdr(), b.body(99, b.tool, one.args()))
	a.check(x.err == nil && x.status == http.StatusOK && x.result() == "done" && b.whole(x),
		"one call alone, the attack over, gets its %s event whole (%s read) and its result: %s", mib(b.size), mib(int(x.n)), x.key())
	a.budgetBack(ctx)
	return nil
}

// 16. Held events: 60 tools/call of 2026-07-28 agents on the held route,
// each answered by the session-era upstream with one 7 MiB progress
// event, held 5 s before the result.
func (h *harness) attackHeldEvents() hostileAttack {
	b := bigEventAttack{calls: 60, size: hostileEvent, copies: 3, hold: 5 * time.Second, tool: "big_progress",
		hdr: func() http.Header { return heldHeader("big_progress") }, body: heldCallBody}
	b.whole = func(x streamAnswer) bool {
		return x.n > int64(b.size) && bytes.Contains(x.head, []byte(`"method":"notifications/progress"`))
	}
	return hostileAttack{
		name: "held route, large events",
		sends: fmt.Sprintf("%d concurrent tools/call of `big_progress` from a 2026-07-28 agent (held route: MCP-Protocol-Version 2026-07-28, Mcp-Method, _meta), each answered by the session-era upstream with one %s notifications/progress event, then its result %s later",
			b.calls, mib(b.size), b.hold),
		cap: "an event the held route reads whole, with its copies, is counted in memory_budget past 64 KiB (-32017 beyond; max_sse_line 8 MiB)",
		run: func(ctx context.Context, a *attackRun) error {
			b.run(ctx, a)
			return nil
		},
		after: b.after,
	}
}

// 17. A request renumbered after a heal: the upstream forgets the
// agent's session, mcpheal heals it (generation 2), then 60 calls are each
// answered with a 7 MiB sampling/createMessage request, its line's end
// held back 5 s.
func (h *harness) attackRenumbered() hostileAttack {
	var sess bench.Session
	b := bigEventAttack{calls: 60, size: hostileEvent, copies: 2, hold: 5 * time.Second, tool: "big_request",
		hdr: func() http.Header { return sess.Header() }, body: func(id int, tool, args string) []byte { return toolCall(id, tool, args) }}
	b.whole = func(x streamAnswer) bool {
		// mcpheal's id for the request, not the upstream's ask-<id>.
		return x.n > int64(b.size) && bytes.Contains(x.head, []byte(`"method":"sampling/createMessage"`)) && !bytes.Contains(x.head, []byte(`"id":"ask-`))
	}
	return hostileAttack{
		name: "renumbered request",
		sends: fmt.Sprintf("one session (sampling capability) whose upstream session expired and was healed; then %d concurrent tools/call of `big_request`, each answered with one %s sampling/createMessage request, its line's last bytes %s later",
			b.calls, mib(b.size), b.hold),
		cap: "after a heal a server→client request is renumbered, its line held whole: counted in memory_budget past 64 KiB, with its copy (-32017 beyond; max_sse_line 8 MiB)",
		setup: func(ctx context.Context, a *attackRun) error {
			var err error
			if sess, err = a.initializeWith(ctx, `{"sampling":{}}`); err != nil {
				return err
			}
			if err := getJSON(ctx, a.hc, http.MethodPost, a.upURL+"/admin/expire", &struct{}{}); err != nil {
				return err
			}
			x := a.post(ctx, sess.ID, []byte(`{"jsonrpc":"2.0","id":2,"method":"ping"}`))
			healed, err := a.metricWhere(ctx, "mcpheal_heals_total", `outcome="ok"`)
			if err != nil {
				return err
			}
			if x.status != http.StatusOK || x.code != 0 || healed < 1 {
				return fmt.Errorf("the ping after the upstream expired the session: %s, %v heals", x.key(), healed)
			}
			return nil
		},
		run: func(ctx context.Context, a *attackRun) error {
			a.note("the session was healed once before the calls (mcpheal_heals_total{outcome=\"ok\"}), so its requests are renumbered")
			b.run(ctx, a)
			return nil
		},
		after: b.after,
	}
}

// initializeWith opens a session as an agent of client capabilities caps
// does: initialize, then notifications/initialized.
func (a *attackRun) initializeWith(ctx context.Context, caps string) (bench.Session, error) {
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + bench.ProtocolVersion +
		`","capabilities":` + caps + `,"clientInfo":{"name":"mcpbench-sampling","version":"1"}}}`)
	x := a.post(ctx, "", body)
	if x.err != nil || x.status != http.StatusOK || x.sid == "" {
		return bench.Session{}, fmt.Errorf("initialize: %s", x.key())
	}
	s := bench.Session{URL: a.url, ID: x.sid, Protocol: bench.ProtocolVersion}
	if y := a.post(ctx, s.ID, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); y.err != nil || y.status != http.StatusAccepted {
		return s, fmt.Errorf("notifications/initialized: %s", y.key())
	}
	return s, nil
}
