package doctor

// The probes, in the order Run sends them, and the verdict drawn from them.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/classify"
)

// probeTimeout bounds each request the doctor sends.
const probeTimeout = 5 * time.Second

// getTimeout bounds the wait for the head of the GET stream: a server that
// holds it back until its first event is reported as such, not waited for.
const getTimeout = 2 * time.Second

// sessionVersions are the session-era protocol versions tried with
// initialize, newest first (MCP spec changelogs).
var sessionVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26"}

// clientInfo names the doctor in initialize and server/discover.
const clientInfo = `{"name":"mcpheal-doctor","version":"1"}`

// prober holds one run's client and settings.
type prober struct {
	url  string
	hdr  http.Header
	c    *http.Client
	cred Credential     // nil: none, or no longer usable
	use  *CredentialUse // what became of cred; nil without one
}

// Options are what RunWith sends besides its probes.
type Options struct {
	// Header is added to every request (Authorization, for one; the auth
	// probe goes without it).
	Header http.Header
	// Credential is the credential mcpheal owns for the server, which
	// every probe but the auth probe carries, as mcpheal would; nil: none.
	Credential Credential
	// LoginFile is the token file of `mcpheal login` that Credential
	// reads, if that is what it is: the report names it in the command
	// that logs in again.
	LoginFile string
}

// Credential is a credential mcpheal owns for a server (the token file of
// `mcpheal login`, a configured OAuth client or header), kept by its owner
// as mcpheal keeps it: fetched, refreshed, dropped after a 401. The doctor
// never prints what it returns.
type Credential interface {
	// Header returns the header(s) to send with the next request; an
	// error means there is no usable credential (no login yet, a refresh
	// the authorization server refused) and says what to do.
	Header(ctx context.Context) (http.Header, error)
	// Refused says the server answered 401 to h: the next Header fetches
	// a new token, if the credential has a way to.
	Refused(h http.Header)
	// String names the credential in the report (where it comes from,
	// never its secret).
	String() string
}

// Run probes the MCP server at url (a Streamable HTTP endpoint) and reports
// how the proxy would fare with it. hdr is added to every request
// (Authorization, for one; the auth probe goes without it). The error is set only when the server could not
// be reached at all; everything else is in the Report. Sessions it opens are
// DELETEd before it returns.
func Run(ctx context.Context, url string, hdr http.Header) (*Report, error) {
	return RunWith(ctx, url, Options{Header: hdr})
}

// RunWith is Run with mcpheal's own credential for the server, if any:
// the probes carry it as mcpheal's requests would, a 401 to it makes the
// doctor drop the token and send once more with a new one (as mcpheal
// does), and the verdict is what mcpheal would make of the server with
// it. A credential that cannot be had is reported, and the probes go
// without it.
func RunWith(ctx context.Context, url string, o Options) (*Report, error) {
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	d := &prober{url: url, hdr: o.Header, c: &http.Client{Transport: tr}}
	r := &Report{URL: url, authGiven: o.Header.Get("Authorization") != ""}
	if o.Credential != nil {
		d.cred = o.Credential
		d.use = &CredentialUse{From: o.Credential.String(), LoginFile: o.LoginFile}
		r.Credential = d.use
		cctx, cancel := context.WithTimeout(ctx, probeTimeout)
		d.credHeader(cctx) // a credential that cannot be had is known before the first probe
		cancel()
	}
	if err := d.probeVersions(ctx, r); err != nil {
		return nil, err
	}
	r.Discover = d.discover(ctx)
	if d.needsAuthProbe(r) {
		r.Auth = d.auth(ctx)
	}
	if r.Protocol == "" {
		conclude(r)
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
	conclude(r)
	return r, nil
}

// probeVersions tries initialize with each session-era version. It fails
// only when the server cannot be reached.
func (d *prober) probeVersions(ctx context.Context, r *Report) error {
	reached := false
	var firstErr string
	for _, v := range sessionVersions {
		p := VersionProbe{Version: v}
		a, msg, h := d.post(ctx, "", "", "initialize", initBody(v))
		p.Answer = a
		// An answer head is enough: a body that failed is in the report.
		if a.Status != 0 {
			reached = true
		} else if firstErr == "" {
			firstErr = a.Err
		}
		p.Got = gjson.GetBytes(msg, "result.protocolVersion").String() // msg is nil unless read whole
		p.Accepted = a.Status/100 == 2 && p.Got == v
		if r.Server == "" {
			r.Server = strings.TrimSpace(gjson.GetBytes(msg, "result.serverInfo.name").String() + " " +
				gjson.GetBytes(msg, "result.serverInfo.version").String())
		}
		if p.Accepted && r.Protocol == "" {
			r.Protocol = v
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
func (d *prober) openSession(ctx context.Context, r *Report) string {
	_, _, h := d.post(ctx, "", "", "initialize", initBody(r.Protocol))
	sid := h.Get("Mcp-Session-Id")
	d.post(ctx, sid, r.Protocol, "notifications/initialized", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return sid
}

// discover asks for the 2026-07-28 protocol (SEP-2575 server/discover). A
// pre-2026 server may open a session for it; that session is DELETEd.
func (d *prober) discover(ctx context.Context) DiscoverProbe {
	const v = "2026-07-28"
	body := `{"jsonrpc":"2.0","id":"doctor-discover","method":"server/discover","params":{"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"` + v + `",` +
		`"io.modelcontextprotocol/clientInfo":` + clientInfo + `,` +
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
func (d *prober) ping(ctx context.Context, sid, version, id string) (Answer, bool) {
	a, msg, _ := d.post(ctx, sid, version, "ping", `{"jsonrpc":"2.0","id":"`+id+`","method":"ping"}`)
	return a, a.Status/100 == 2 && gjson.GetBytes(msg, "result").IsObject()
}

// tools pages through tools/list (at most 20 pages) and counts every tool
// and its annotations.
func (d *prober) tools(ctx context.Context, sid, version string) ToolSummary {
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
			ts.Listed = false // a failed later page makes the count partial: no count then
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
func (d *prober) getStream(ctx context.Context, sid, version string) Answer {
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	resp, err := d.do(ctx, func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
		if err != nil {
			return nil, err
		}
		d.headers(req, sid, version)
		req.Header.Set("Accept", "text/event-stream")
		return req, nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return Answer{Err: fmt.Sprintf("no answer head within %v", getTimeout)}
		}
		return Answer{Err: err.Error()}
	}
	defer resp.Body.Close()
	a := Answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type")}
	if !isEventStream(a.ContentType) {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		a.Body = printable(b)
	}
	return a
}

// unknownID sends ping with a session id the server never issued but that
// looks like sid (same prefix, length and alphabet), as an expired id would,
// and classifies the answer exactly as the proxy does.
func (d *prober) unknownID(ctx context.Context, sid, version string) UnknownProbe {
	fake := lookalike(sid)
	raw, a, _, _ := d.exchange(ctx, fake, version, "ping", `{"jsonrpc":"2.0","id":"doctor-unknown","method":"ping"}`)
	p := UnknownProbe{Answer: a}
	if a.Err == "" {
		p.Class = classify.Classify(a.Status, []byte(a.ContentType), raw)
	}
	return p
}

// delete ends a session the doctor opened (best effort).
func (d *prober) delete(ctx context.Context, sid, version string) Answer {
	if sid == "" {
		return Answer{}
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	resp, err := d.do(ctx, func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, d.url, nil)
		if err != nil {
			return nil, err
		}
		d.headers(req, sid, version)
		return req, nil
	})
	if err != nil {
		return Answer{Err: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return Answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: printable(b)}
}

func initBody(version string) string {
	return `{"jsonrpc":"2.0","id":"doctor-init","method":"initialize","params":{"protocolVersion":"` + version +
		`","capabilities":{},"clientInfo":` + clientInfo + `}}`
}

// conclude sets the verdict and its notes.
func conclude(r *Report) {
	r.Bridged = r.Discover.Accepted
	for _, v := range r.Discover.SupportedVersions {
		if v < "2026-07-28" {
			r.Bridged = false // it serves session-era agents itself
		}
	}
	r.Held = !r.Discover.Accepted && r.Protocol != ""
	switch {
	case r.Credential != nil && r.Credential.Err != "":
		// mcpheal would send no request at all: every agent would get
		// its error instead.
		r.Verdict = VerdictNeedsLogin
		r.Notes = append(r.Notes, r.loginNotes()...)
	case r.Bridged:
		r.Verdict = VerdictStateless
		r.Notes = append(r.Notes, "speaks only 2026-07-28 (no sessions): mcpheal bridges session-era agents to it "+
			"(it owns their sessions and translates each request), passes 2026-07-28 agents through, and retries transport failures")
	case r.Protocol == "" && r.Discover.Accepted:
		r.Verdict = VerdictStateless
		r.Notes = append(r.Notes, "speaks only 2026-07-28 (no sessions): mcpheal passes it through and retries transport failures only")
	case r.Protocol == "" && r.unauthorized():
		r.Verdict = VerdictNeedsLogin
		r.Notes = append(r.Notes, r.loginNotes()...)
	case r.Protocol == "":
		r.Verdict = VerdictNotHealable
		r.Notes = append(r.Notes, "accepted no initialize of "+strings.Join(sessionVersions, ", ")+
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
