package main

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/bench"
)

// upstream -mode hostile: a minimal stateful MCP server on net/http whose
// tools attack the proxy in front of it (the hostile-input section,
// hostile.go). initialize mints an Mcp-Session-Id; any other request needs
// a live one (404 -32001 otherwise); notifications get 202; ping,
// tools/list and tools/call by name:
//
//	echo        {"text": T}: T as text (a harmless call)
//	big         {"bytes": N}: a JSON answer of N bytes of text (default 2 MiB), with Content-Length
//	huge        {"bytes": N}: the same, 100 MiB by default, chunked (no Content-Length), so
//	            the reader learns its size only by reading it
//	endless     {"mibps": R}: an SSE answer whose one data line never ends, written at R MiB/s
//	            (default 8) until the client goes away or 60 s pass
//	endless_id  the same with an id: line, which a proxy rewriting event ids must hold whole
//	big_progress {"bytes": N, "hold_ms": M}: an SSE answer: one notifications/progress event
//	            whose message is N bytes (default 7 MiB), then the result "done" after M ms
//	big_request  the same with a sampling/createMessage request of N bytes of text instead;
//	            the last bytes of its line come only after the M ms (its reader holds the
//	            line unfinished until then)
//
// None is annotated read-only or idempotent. resources/subscribe and
// resources/unsubscribe answer {} (the journal-flood attack). /admin/stats
// counts calls per tool, the subscribes received, the endless answers
// being written now and the OAuth metadata documents asked for; POST
// /admin/expire forgets every session (the next request on one gets 404
// -32001, as from a server that expired it). Its protected resource
// metadata (/.well-known/oauth-protected-resource/mcp) is a document of
// hostileMetadata bytes, with Content-Length.
//
// Under /modern/ it is also a server that speaks only MCP 2026-07-28
// (hostileModern), which mcpheal bridges session-era agents to.
type hostileUpstream struct {
	inits, deletes atomic.Int64
	sids           atomic.Uint64
	streams        atomic.Int64 // endless answers being written now
	// subscribes counts the subscriptions the server was asked for:
	// resources/subscribe requests (either era), and the URIs each
	// 2026-07-28 subscriptions/listen names.
	subscribes atomic.Int64
	discovers  atomic.Int64 // server/discover requests (2026-07-28)
	listens    atomic.Int64 // subscriptions/listen requests received
	wellKnowns atomic.Int64 // protected resource metadata documents asked for
	expires    atomic.Int64 // sessions forgotten by /admin/expire

	mu       sync.Mutex
	sessions map[string]bool
	calls    map[string]int64
}

// hostileStats is upstream -mode hostile's /admin/stats answer.
type hostileStats struct {
	Initializes int64            `json:"initializes"`
	Deletes     int64            `json:"deletes"`
	Sessions    int64            `json:"sessions"` // live: initialized and not deleted
	Streams     int64            `json:"streams"`
	Calls       map[string]int64 `json:"calls"`
	Subscribes  int64            `json:"subscribes"`
	Discovers   int64            `json:"discovers"`
	Listens     int64            `json:"listens"`
	WellKnowns  int64            `json:"well_knowns"`
	Expired     int64            `json:"expired"`
}

// Limits of the hostile tools: an endless answer ends after this long
// even if its reader stays, and a rate is capped, so that a harness that
// forgets a stream cannot leave a process writing forever.
const (
	hostileStreamMax = 60 * time.Second
	hostileMaxMiBps  = 64
	hostileBig       = 2 << 20
	hostileHuge      = 100 << 20
	// hostileEvent is the default size of big_progress's and big_request's
	// one large event: under max_sse_line (8 MiB), so a proxy relays it.
	hostileEvent = 7 << 20
	// hostileMaxHold caps how long big_progress and big_request hold
	// their answer.
	hostileMaxHold = 20 * time.Second
	// hostileMetadata is the size of the protected resource metadata
	// document: under max_answer (32 MiB), so a proxy that reads it whole
	// as any answer can.
	hostileMetadata = 30 << 20
)

// hostileFill is the text every answer is made of (no JSON escaping).
var hostileFill = bytes.Repeat([]byte("x"), 64<<10)

func newHostileUpstream() *hostileUpstream {
	return &hostileUpstream{sessions: map[string]bool{}, calls: map[string]int64{}}
}

func (u *hostileUpstream) stats() hostileStats {
	u.mu.Lock()
	defer u.mu.Unlock()
	calls := make(map[string]int64, len(u.calls))
	for k, v := range u.calls {
		calls[k] = v
	}
	return hostileStats{Initializes: u.inits.Load(), Deletes: u.deletes.Load(), Sessions: int64(len(u.sessions)),
		Streams: u.streams.Load(), Calls: calls, Subscribes: u.subscribes.Load(), Discovers: u.discovers.Load(), Listens: u.listens.Load(),
		WellKnowns: u.wellKnowns.Load(), Expired: u.expires.Load()}
}

// expireAll forgets every session, as a server that expired them does.
func (u *hostileUpstream) expireAll() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := len(u.sessions)
	clear(u.sessions)
	u.expires.Add(int64(n))
	return n
}

func (u *hostileUpstream) known(sid string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sessions[sid]
}

func (u *hostileUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	switch r.Method {
	case http.MethodPost:
	case http.MethodDelete:
		u.mu.Lock()
		if u.sessions[sid] {
			delete(u.sessions, sid)
			u.deletes.Add(1)
		}
		u.mu.Unlock()
		w.WriteHeader(http.StatusOK)
		return
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	id := gjson.GetBytes(body, "id").Raw
	method := gjson.GetBytes(body, "method").Str
	if method == "initialize" {
		u.inits.Add(1)
		sid = "hostile-" + strconv.FormatUint(u.sids.Add(1), 10)
		u.mu.Lock()
		u.sessions[sid] = true
		u.mu.Unlock()
		w.Header().Set("Mcp-Session-Id", sid)
		hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+orNull(id)+`,"result":{"protocolVersion":"`+bench.ProtocolVersion+
			`","capabilities":{"tools":{},"resources":{"subscribe":true}},"serverInfo":{"name":"bench-hostile","version":"1"}}}`)
		return
	}
	if !u.known(sid) {
		hostileJSON(w, http.StatusNotFound, `{"jsonrpc":"2.0","id":`+orNull(id)+`,"error":{"code":-32001,"message":"Session not found"}}`)
		return
	}
	if id == "" { // a notification or a response
		w.WriteHeader(http.StatusAccepted)
		return
	}
	switch method {
	case "ping", "resources/unsubscribe":
		hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{}}`)
	case "resources/subscribe":
		u.subscribes.Add(1)
		hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{}}`)
	case "tools/list":
		var b bytes.Buffer
		b.WriteString(`{"jsonrpc":"2.0","id":` + id + `,"result":{"tools":[`)
		for i, name := range []string{bench.EchoTool, "big", "huge", "endless", "endless_id", "big_progress", "big_request"} {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"name":"` + name + `","inputSchema":{"type":"object"}}`)
		}
		b.WriteString(`]}}`)
		hostileJSON(w, http.StatusOK, b.String())
	case "tools/call":
		name := gjson.GetBytes(body, "params.name").Str
		args := gjson.GetBytes(body, "params.arguments")
		u.mu.Lock()
		u.calls[name]++
		u.mu.Unlock()
		switch name {
		case bench.EchoTool:
			text := strconv.Quote(args.Get("text").Str) // the harness sends plain ASCII
			hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{"content":[{"type":"text","text":`+text+`}]}}`)
		case "big":
			writeTextAnswer(w, id, intArg(args, "bytes", hostileBig, 1<<30), true)
		case "huge":
			writeTextAnswer(w, id, intArg(args, "bytes", hostileHuge, 1<<30), false)
		case "endless", "endless_id":
			u.endless(w, r, id, name == "endless_id", intArg(args, "mibps", 8, hostileMaxMiBps))
		case "big_progress", "big_request":
			token := gjson.GetBytes(body, "params._meta.progressToken").Raw
			hold := time.Duration(intArg(args, "hold_ms", 0, int(hostileMaxHold/time.Millisecond))) * time.Millisecond
			bigEvent(w, r, id, orNull(token), name == "big_request", intArg(args, "bytes", hostileEvent, 16<<20), hold)
		default:
			hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32602,"message":"unknown tool"}}`)
		}
	default:
		hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32601,"message":"method not found"}}`)
	}
}

func orNull(id string) string {
	if id == "" {
		return "null"
	}
	return id
}

// intArg reads a positive integer argument, def when absent, at most max.
func intArg(args gjson.Result, name string, def, limit int) int {
	n := int(args.Get(name).Int())
	if n <= 0 {
		n = def
	}
	return min(n, limit)
}

func hostileJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// writeTextAnswer writes a tools/call result of n bytes of text; with
// length set it announces its size (Content-Length), otherwise it is sent
// chunked. It stops at the first failed write (the reader went away).
func writeTextAnswer(w http.ResponseWriter, id string, n int, length bool) {
	pre := `{"jsonrpc":"2.0","id":` + id + `,"result":{"content":[{"type":"text","text":"`
	const post = `"}]}}`
	w.Header().Set("Content-Type", "application/json")
	if length {
		w.Header().Set("Content-Length", strconv.Itoa(len(pre)+n+len(post)))
	}
	if _, err := io.WriteString(w, pre); err != nil {
		return
	}
	for n > 0 {
		k := min(n, len(hostileFill))
		if _, err := w.Write(hostileFill[:k]); err != nil {
			return
		}
		n -= k
	}
	_, _ = io.WriteString(w, post)
}

// endless writes an SSE answer whose line never ends: a data: line (the
// start of the JSON-RPC response, then text) or an id: line, at mibps MiB/s
// in 10 ms ticks, until a write fails, the client goes away or
// hostileStreamMax passes.
func (u *hostileUpstream) endless(w http.ResponseWriter, r *http.Request, id string, idLine bool, mibps int) {
	u.streams.Add(1)
	defer u.streams.Add(-1)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	head := "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":" + id + ",\"result\":{\"content\":[{\"type\":\"text\",\"text\":\""
	if idLine {
		head = "event: message\nid: "
	}
	rc := http.NewResponseController(w)
	if _, err := io.WriteString(w, head); err != nil || rc.Flush() != nil {
		return
	}
	perTick := mibps << 20 / 100
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	end := time.NewTimer(hostileStreamMax)
	defer end.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-tick.C:
		}
		for n := perTick; n > 0; {
			k := min(n, len(hostileFill))
			if _, err := w.Write(hostileFill[:k]); err != nil {
				return
			}
			n -= k
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// bigEvent writes an SSE answer of one large event and the result "done":
// a notifications/progress whose message is n bytes, or (request) a
// sampling/createMessage asking about n bytes of text, which a proxy that
// renumbers server→client requests must hold whole. The answer waits hold
// before its result; a request's line waits with its last bytes unsent,
// so that its reader holds it unfinished meanwhile. It stops when a write
// fails or the client goes away.
func bigEvent(w http.ResponseWriter, r *http.Request, id, token string, request bool, n int, hold time.Duration) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	head := `event: message` + "\n" + `data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":` + token +
		`,"progress":1,"message":"`
	tail := `"}}` + "\n\n"
	if request {
		head = `event: message` + "\n" + `data: {"jsonrpc":"2.0","id":"ask-` + strings.Trim(id, `"`) +
			`","method":"sampling/createMessage","params":{"maxTokens":1,"messages":[{"role":"user","content":{"type":"text","text":"`
		tail = `"}}]}}` + "\n\n"
	}
	rest := ""
	if request && hold > 0 {
		rest, tail = tail, ""
	}
	rc := http.NewResponseController(w)
	if _, err := io.WriteString(w, head); err != nil {
		return
	}
	for n > 0 {
		k := min(n, len(hostileFill))
		if _, err := w.Write(hostileFill[:k]); err != nil {
			return
		}
		n -= k
	}
	if _, err := io.WriteString(w, tail); err != nil || rc.Flush() != nil {
		return
	}
	if hold > 0 {
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	_, _ = io.WriteString(w, rest+`event: message`+"\n"+`data: {"jsonrpc":"2.0","id":`+id+
		`,"result":{"content":[{"type":"text","text":"done"}]}}`+"\n\n")
}

// metadata serves the protected resource metadata of the session-era
// server: hostileMetadata bytes, its resource the server's own URL, with
// Content-Length, written from hostileFill (nothing of its size is held).
func (u *hostileUpstream) metadata(w http.ResponseWriter, r *http.Request) {
	u.wellKnowns.Add(1)
	head := `{"resource":"http://` + r.Host + hostilePath + `","authorization_servers":["https://as.example"],"bench_padding":"`
	const tail = `"}`
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(head)+hostileMetadata+len(tail)))
	if _, err := io.WriteString(w, head); err != nil {
		return
	}
	for n := hostileMetadata; n > 0; {
		k := min(n, len(hostileFill))
		if _, err := w.Write(hostileFill[:k]); err != nil {
			return
		}
		n -= k
	}
	_, _ = io.WriteString(w, tail)
}

// Paths of upstream -mode hostile: the session-era server, and the two
// 2026-07-28-only ones (hostileModern), one whose server/discover carries
// hostileInstructions bytes of instructions.
const (
	hostilePath       = "/mcp"
	hostileModernPath = "/modern/mcp"
	hostileFatPath    = "/modern/fat/mcp"
	// hostileInstructions is the fat server's instructions: each bridged
	// initialize answer carries them whole.
	hostileInstructions = 20 << 20
	modernVersion       = "2026-07-28"
	// hostileFloodURI begins every URI the journal-flood attack subscribes
	// to; the 2026-07-28 server counts it, quoted, in a listen's body.
	hostileFloodURI = "hostile://flood/"
	// hostileWellKnown is where the session-era server's protected
	// resource metadata is (RFC 9728: the well-known segment before its
	// path), which mcpheal forwards its agents to.
	hostileWellKnown = "/.well-known/oauth-protected-resource" + hostilePath
)

// register serves the hostile servers and their counters on mux.
func (u *hostileUpstream) register(mux *http.ServeMux) {
	mux.Handle(hostilePath, u)
	mux.Handle(hostileModernPath, &hostileModern{u: u})
	mux.Handle(hostileFatPath, &hostileModern{u: u, instructions: hostileInstructions})
	mux.HandleFunc("/admin/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, u.stats()) })
	mux.HandleFunc("POST /admin/expire", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]int{"expired": u.expireAll()})
	})
	mux.HandleFunc("GET "+hostileWellKnown, u.metadata)
}

// hostileModern is a server that speaks only MCP 2026-07-28, as mcpheal's
// bridge meets it: no sessions; server/discover lists 2026-07-28 alone;
// any other request without MCP-Protocol-Version 2026-07-28 gets 400
// -32022 (how such a server refuses a session-era agent); a GET gets 405.
// It serves tools/list and tools/call of echo, and subscriptions/listen:
// an SSE stream with the acknowledgement, then nothing until the client
// leaves or hostileStreamMax passes. It counts, in its hostileUpstream, the
// URIs a listen names and any resources/subscribe (2026-07-28 has none:
// 404 -32601).
type hostileModern struct {
	u            *hostileUpstream
	instructions int // bytes of instructions in the discover answer; 0 for none

	once sync.Once
	tail []byte // the discover answer after its id, built once
}

func (m *hostileModern) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	// A listen names every subscribed URI: read what a request needs, and
	// count the flood's URIs in all of it, without holding a body of any
	// size.
	body, uris, err := readCounting(r.Body, 8<<20, []byte(`"`+hostileFloodURI))
	id := gjson.GetBytes(body, "id").Raw
	method := gjson.GetBytes(body, "method").Str
	if method == "" {
		method = r.Header.Get("Mcp-Method")
	}
	if method == "subscriptions/listen" {
		// Counted as they arrived, even when the client gave up sending.
		m.u.listens.Add(1)
		m.u.subscribes.Add(int64(uris))
	}
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if method == "server/discover" {
		m.u.discovers.Add(1)
		m.writeDiscover(w, orNull(id))
		return
	}
	if r.Header.Get("Mcp-Protocol-Version") != modernVersion {
		hostileJSON(w, http.StatusBadRequest, `{"jsonrpc":"2.0","id":`+orNull(id)+
			`,"error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":["`+modernVersion+`"]}}}`)
		return
	}
	if id == "" {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	switch method {
	case "tools/list":
		hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{"tools":[{"name":"`+bench.EchoTool+`","inputSchema":{"type":"object"}}]}}`)
	case "tools/call":
		name := gjson.GetBytes(body, "params.name").Str
		m.u.mu.Lock()
		m.u.calls[name]++
		m.u.mu.Unlock()
		if name != bench.EchoTool {
			hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32602,"message":"unknown tool"}}`)
			return
		}
		text := strconv.Quote(gjson.GetBytes(body, "params.arguments.text").Str)
		hostileJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{"content":[{"type":"text","text":`+text+`}]}}`)
	case "subscriptions/listen":
		m.listen(w, r)
	case "resources/subscribe":
		m.u.subscribes.Add(1)
		fallthrough
	default:
		hostileJSON(w, http.StatusNotFound, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32601,"message":"Method not found"}}`)
	}
}

// writeDiscover answers server/discover, with Content-Length.
func (m *hostileModern) writeDiscover(w http.ResponseWriter, id string) {
	m.once.Do(func() {
		var b bytes.Buffer
		b.WriteString(`,"result":{"supportedVersions":["` + modernVersion + `"],"capabilities":{"tools":{},"resources":{"subscribe":true}},`)
		if m.instructions > 0 {
			b.Grow(m.instructions + 256)
			b.WriteString(`"instructions":"`)
			for n := m.instructions; n > 0; n -= min(n, len(hostileFill)) {
				b.Write(hostileFill[:min(n, len(hostileFill))])
			}
			b.WriteString(`",`)
		}
		b.WriteString(`"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"hostile","version":"1"}}}}`)
		m.tail = b.Bytes()
	})
	head := `{"jsonrpc":"2.0","id":` + id
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(head)+len(m.tail)))
	w.WriteHeader(http.StatusOK)
	if _, err := io.WriteString(w, head); err == nil {
		_, _ = w.Write(m.tail)
	}
}

// listen holds a subscriptions/listen stream open: the acknowledgement,
// then nothing until the client leaves or hostileStreamMax passes.
func (m *hostileModern) listen(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/subscriptions/acknowledged\",\"params\":{}}\n\n")
	_ = http.NewResponseController(w).Flush()
	end := time.NewTimer(hostileStreamMax)
	defer end.Stop()
	select {
	case <-r.Context().Done():
	case <-end.C:
	}
}

// readCounting reads r to its end: it returns the first limit bytes, and
// how many times marker occurs in all of it (in what was read, on an
// error).
func readCounting(r io.Reader, limit int, marker []byte) (head []byte, n int, err error) {
	head, err = io.ReadAll(io.LimitReader(r, int64(limit)))
	n = bytes.Count(head, marker)
	if err != nil {
		return head, n, err
	}
	// win holds the last len(marker)-1 bytes seen (too few to hold a
	// marker counted already) and the next read.
	win := slices.Clone(head[max(0, len(head)-len(marker)+1):])
	buf := make([]byte, 64<<10)
	for {
		k, rerr := r.Read(buf)
		if k > 0 {
			win = append(win, buf[:k]...)
			n += bytes.Count(win, marker)
			win = append(win[:0], win[max(0, len(win)-len(marker)+1):]...)
		}
		if rerr == io.EOF {
			return head, n, nil
		}
		if rerr != nil {
			return head, n, rerr
		}
	}
}
