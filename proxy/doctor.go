package proxy

// Doctor: `mcpheal doctor URL` (issue 5 §6). It talks to an MCP server the
// way the proxy will (initialize, a session id on every later request) and
// reports what the proxy needs to know: which protocol versions the server
// accepts, whether it has sessions, what its session ids look like, how it
// answers a session id it does not know and which class the proxy gives that
// answer, GET stream, ping and tool annotations. It uses net/http, not the
// proxy's upstream client: it is a one-shot CLI, and an independent client
// keeps the report honest about what the server itself says.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/classify"
)

// doctorProbeTimeout bounds each request the doctor sends.
const doctorProbeTimeout = 5 * time.Second

// doctorGetTimeout bounds the wait for the head of the GET stream: a server
// that holds it back until its first event is reported as such, not waited for.
const doctorGetTimeout = 2 * time.Second

// doctorReadLimit caps how much of one answer the doctor reads.
const doctorReadLimit = 1 << 20

// doctorVersions are the session-era protocol versions tried with
// initialize, newest first (MCP spec changelogs).
var doctorVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26"}

// doctorClientInfo names the doctor in initialize and server/discover.
const doctorClientInfo = `{"name":"mcpheal-doctor","version":"1"}`

// doctor holds one run's client and settings.
type doctor struct {
	url string
	hdr http.Header
	c   *http.Client
}

// Doctor probes the MCP server at url (a Streamable HTTP endpoint) and
// reports how the proxy would fare with it. hdr is added to every request
// (Authorization, for one). The error is set only when the server could not
// be reached at all; everything else is in the Report. Sessions it opens are
// DELETEd before it returns.
func Doctor(ctx context.Context, url string, hdr http.Header) (*Report, error) {
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	d := &doctor{url: url, hdr: hdr, c: &http.Client{Transport: tr}}
	r := &Report{URL: url}
	if err := d.probeVersions(ctx, r); err != nil {
		return nil, err
	}
	r.Discover = d.discover(ctx)
	if r.Protocol == "" {
		d.conclude(r)
		return r, nil
	}
	sid := d.openSession(ctx, r)
	r.Stateful = sid != ""
	r.Ping, r.Pong = d.ping(ctx, sid, r.Protocol, "doctor-ping")
	r.Tools = d.tools(ctx, sid, r.Protocol)
	r.GetStream = d.getStream(ctx, sid, r.Protocol)
	r.Unknown = d.unknownID(ctx, sid, r.Protocol)
	if sid != "" {
		r.SessionID = shapeOf(sid)
		r.Delete = d.delete(ctx, sid, r.Protocol)
	}
	d.conclude(r)
	return r, nil
}

// probeVersions tries initialize with each session-era version. It fails
// only when the server cannot be reached.
func (d *doctor) probeVersions(ctx context.Context, r *Report) error {
	reached := false
	var firstErr string
	for _, v := range doctorVersions {
		p := VersionProbe{Version: v}
		a, msg, h := d.post(ctx, "", "", "initialize", initBody(v))
		p.Answer = a
		if a.Err == "" {
			reached = true
			p.Got = gjson.GetBytes(msg, "result.protocolVersion").String()
			p.Accepted = a.Status/100 == 2 && p.Got == v
			if r.Server == "" {
				r.Server = strings.TrimSpace(gjson.GetBytes(msg, "result.serverInfo.name").String() + " " +
					gjson.GetBytes(msg, "result.serverInfo.version").String())
			}
			if p.Accepted && r.Protocol == "" {
				r.Protocol = v
			}
		} else if firstErr == "" {
			firstErr = a.Err
		}
		d.delete(ctx, h.Get("Mcp-Session-Id"), v) // probes only; openSession makes the one we use
		r.Versions = append(r.Versions, p)
	}
	if !reached {
		return fmt.Errorf("doctor %s: %s", d.url, firstErr)
	}
	return nil
}

// openSession runs the handshake the proxy records (initialize, then
// notifications/initialized) and returns the session id ("" if stateless).
func (d *doctor) openSession(ctx context.Context, r *Report) string {
	_, _, h := d.post(ctx, "", "", "initialize", initBody(r.Protocol))
	sid := h.Get("Mcp-Session-Id")
	d.post(ctx, sid, r.Protocol, "notifications/initialized", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return sid
}

// discover asks for the 2026-07-28 protocol (SEP-2575 server/discover). A
// pre-2026 server may open a session for it; that session is DELETEd.
func (d *doctor) discover(ctx context.Context) DiscoverProbe {
	const v = "2026-07-28"
	body := `{"jsonrpc":"2.0","id":"doctor-discover","method":"server/discover","params":{"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"` + v + `",` +
		`"io.modelcontextprotocol/clientInfo":` + doctorClientInfo + `,` +
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`
	a, msg, h := d.post(ctx, "", v, "server/discover", body)
	d.delete(ctx, h.Get("Mcp-Session-Id"), "")
	p := DiscoverProbe{Answer: a}
	// A result lists supportedVersions; an unsupported-version error
	// (-32022) lists them in error.data.supported.
	sv := gjson.GetBytes(msg, "result.supportedVersions")
	if !sv.IsArray() {
		sv = gjson.GetBytes(msg, "error.data.supported")
	}
	if sv.IsArray() {
		p.Supported = true
		for _, x := range sv.Array() {
			p.SupportedVersions = append(p.SupportedVersions, x.String())
			p.Accepted = p.Accepted || x.String() == v
		}
	}
	return p
}

// ping sends ping with session id sid and reports whether it answered {}.
func (d *doctor) ping(ctx context.Context, sid, version, id string) (Answer, bool) {
	a, msg, _ := d.post(ctx, sid, version, "ping", `{"jsonrpc":"2.0","id":"`+id+`","method":"ping"}`)
	return a, a.Status/100 == 2 && gjson.GetBytes(msg, "result").IsObject()
}

// tools pages through tools/list (at most 20 pages) and counts annotations.
func (d *doctor) tools(ctx context.Context, sid, version string) ToolSummary {
	var ts ToolSummary
	cursor := ""
	for page := 0; page < 20; page++ {
		params := `{}`
		if cursor != "" {
			c, _ := json.Marshal(cursor)
			params = `{"cursor":` + string(c) + `}`
		}
		a, msg, _ := d.post(ctx, sid, version, "tools/list",
			fmt.Sprintf(`{"jsonrpc":"2.0","id":"doctor-tools-%d","method":"tools/list","params":%s}`, page, params))
		ts.Answer = a
		list := gjson.GetBytes(msg, "result.tools")
		if a.Status/100 != 2 || !list.IsArray() {
			return ts
		}
		ts.Listed = true
		for _, t := range list.Array() {
			ts.Count++
			if t.Get("annotations.readOnlyHint").Bool() {
				ts.ReadOnly++
			}
			if t.Get("annotations.idempotentHint").Bool() {
				ts.Idempotent++
			}
		}
		if cursor = gjson.GetBytes(msg, "result.nextCursor").String(); cursor == "" {
			return ts
		}
	}
	return ts
}

// getStream opens the standalone GET stream and closes it as soon as the
// head arrived: 200 text/event-stream is support, 405 is a documented no.
func (d *doctor) getStream(ctx context.Context, sid, version string) Answer {
	ctx, cancel := context.WithTimeout(ctx, doctorGetTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return Answer{Err: err.Error()}
	}
	d.headers(req, sid, version)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := d.c.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return Answer{Err: fmt.Sprintf("no answer head within %v", doctorGetTimeout)}
		}
		return Answer{Err: err.Error()}
	}
	defer resp.Body.Close()
	a := Answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type")}
	if !strings.HasPrefix(a.ContentType, "text/event-stream") {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		a.Body = printable(b)
	}
	return a
}

// unknownID sends ping with a session id the server never issued but that
// looks like sid (same prefix, length and alphabet), as an expired id would,
// and classifies the answer exactly as the proxy does.
func (d *doctor) unknownID(ctx context.Context, sid, version string) UnknownProbe {
	fake := lookalike(sid)
	raw, a, _, _ := d.exchange(ctx, fake, version, "ping", `{"jsonrpc":"2.0","id":"doctor-unknown","method":"ping"}`)
	p := UnknownProbe{Answer: a}
	if a.Err == "" {
		p.Class = classify.Classify(a.Status, []byte(a.ContentType), raw)
	}
	return p
}

// delete ends a session the doctor opened (best effort).
func (d *doctor) delete(ctx context.Context, sid, version string) Answer {
	if sid == "" {
		return Answer{}
	}
	ctx, cancel := context.WithTimeout(ctx, doctorProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, d.url, nil)
	if err != nil {
		return Answer{Err: err.Error()}
	}
	d.headers(req, sid, version)
	resp, err := d.c.Do(req)
	if err != nil {
		return Answer{Err: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return Answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: printable(b)}
}

// post sends one JSON-RPC message and returns the answer, the JSON-RPC
// response in it (from JSON or the first SSE response event) and the
// response headers.
func (d *doctor) post(ctx context.Context, sid, version, method, body string) (Answer, []byte, http.Header) {
	_, a, msg, h := d.exchange(ctx, sid, version, method, body)
	return a, msg, h
}

// exchange is post that also returns the raw bytes read (the whole JSON
// body, or the SSE stream up to the response event).
func (d *doctor) exchange(ctx context.Context, sid, version, method, body string) (raw []byte, a Answer, msg []byte, h http.Header) {
	ctx, cancel := context.WithTimeout(ctx, doctorProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, strings.NewReader(body))
	if err != nil {
		return nil, Answer{Err: err.Error()}, nil, http.Header{}
	}
	d.headers(req, sid, version)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Method", method) // 2026-07-28 standard header; ignored before
	resp, err := d.c.Do(req)
	if err != nil {
		return nil, Answer{Err: err.Error()}, nil, http.Header{}
	}
	defer resp.Body.Close()
	a = Answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type")}
	raw, err = readRPC(resp.Body, isEventStream(a.ContentType))
	if err != nil && len(raw) == 0 {
		a.Err = "reading answer: " + err.Error()
	}
	a.Body = printable(raw)
	msg = raw
	if isEventStream(a.ContentType) {
		msg = findResponse(raw)
	}
	return raw, a, msg, resp.Header
}

// headers sets the caller's headers and the session headers on req.
func (d *doctor) headers(req *http.Request, sid, version string) {
	for k, vs := range d.hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	if version != "" {
		req.Header.Set("MCP-Protocol-Version", version)
	}
}

// readRPC reads a JSON body whole, or an SSE body until it holds a JSON-RPC
// response (a POST stream may carry notifications first), up to
// doctorReadLimit.
func readRPC(r io.Reader, sse bool) ([]byte, error) {
	r = io.LimitReader(r, doctorReadLimit)
	if !sse {
		return io.ReadAll(r)
	}
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if findResponse(buf) != nil {
			return buf, nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return buf, nil
			}
			return buf, err
		}
	}
}

func isEventStream(ct string) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream")
}

func initBody(version string) string {
	return `{"jsonrpc":"2.0","id":"doctor-init","method":"initialize","params":{"protocolVersion":"` + version +
		`","capabilities":{},"clientInfo":` + doctorClientInfo + `}}`
}

// printable returns a one-line prefix of b fit for a terminal: at most 200
// bytes, control characters shown as spaces.
func printable(b []byte) string {
	const limit = 200
	cut := len(b) > limit
	if cut {
		b = b[:limit]
	}
	b = bytes.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, b)
	s := strings.TrimSpace(string(b))
	if cut {
		s += "…"
	}
	return s
}

// conclude sets the verdict and its notes.
func (d *doctor) conclude(r *Report) {
	switch {
	case r.Protocol == "" && r.Discover.Accepted:
		r.Verdict = VerdictStateless
		r.Notes = append(r.Notes, "speaks only 2026-07-28 (no sessions): mcpheal passes it through and retries transport failures only")
	case r.Protocol == "":
		r.Verdict = VerdictNotHealable
		r.Notes = append(r.Notes, "accepted no initialize of "+strings.Join(doctorVersions, ", ")+
			": check the URL (it must be the MCP endpoint, usually …/mcp) and credentials (-H)")
	case !r.Stateful:
		r.Verdict = VerdictStateless
		r.Notes = append(r.Notes, "no Mcp-Session-Id: there is no session to lose; mcpheal retries transport failures only")
	case r.Unknown.Class == classify.SessionGone:
		r.Verdict = VerdictHealable
		r.Notes = append(r.Notes, "an expired session is recognised: mcpheal re-initializes and replays the request")
	case r.Unknown.Class == classify.OK:
		r.Verdict = VerdictExpiryInvisible
		r.Notes = append(r.Notes, "expiry invisible: the server accepts a session id it never issued, so a dead "+
			"session never shows; calls keep working but per-session state (log level, subscriptions, "+
			"session tools) may be lost silently; mcpheal has nothing to heal and heals transport failures only")
	default:
		r.Verdict = VerdictNotHealable
		r.Notes = append(r.Notes, "an unknown session id is answered as "+r.Unknown.Class.String()+
			", not as a dead session: mcpheal passes it through and cannot heal; please report this answer")
	}
	if r.Stateful && r.SessionID.Charset == "invalid" {
		r.Notes = append(r.Notes, "session id has characters outside visible ASCII (MCP requires 0x21–0x7E)")
	}
	if r.Discover.Accepted && r.Protocol != "" {
		r.Notes = append(r.Notes, "2026-07-28 clients use it without sessions: mcpheal passes that traffic through")
	}
}
