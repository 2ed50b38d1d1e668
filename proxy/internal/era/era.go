package era

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// Protocol eras (docs/eras.md "Across protocol eras"). MCP 2026-07-28 removed
// sessions; a server that speaks only it refuses the session-era
// handshake, one of the session era refuses 2026-07-28 requests, and the
// spec gives neither agent a way forward. mcpheal asks each upstream which
// versions it speaks (server/discover). When none of them is of the
// session era, it bridges its legacy agents (bridge.go): it keeps their
// sessions itself and speaks 2026-07-28 upstream. When the upstream
// speaks only the session era, it holds sessions for its 2026-07-28
// agents (held.go).

const (
	eraUnknown = iota // not asked yet, or asked again after a restart
	EraLegacy         // the session era only: 2026-07-28 agents go through the held route
	EraModern         // 2026-07-28 only: bridge legacy agents
	eraBoth           // both eras: every agent passes through
)

// Discovery is what server/discover told of a 2026-07-28 upstream.
type Discovery struct {
	Capabilities []byte // the result's capabilities object, raw JSON
	ServerInfo   []byte // _meta["io.modelcontextprotocol/serverInfo"], raw JSON
	Instructions []byte // raw JSON string, or nil
}

// eraState caches the upstream's era.
type State struct {
	Cfg  *conf.Config
	Log  *zerolog.Logger
	Link *link.Link
	Mem  *wire.Budget
	Bg   *wire.BgGroup

	V          atomic.Int32
	Info       atomic.Pointer[Discovery]
	mu         sync.Mutex  // one probe at a time; protects refused
	rechecking atomic.Bool // a background recheck runs
	// unanswered is when (unix nanoseconds) a probe last got no answer in
	// time (a server slow to initialize, or down): requests pass through
	// without asking again until probeHoldOff has passed, or the upstream
	// answers again (recheck), rather than each wait out a probe.
	unanswered atomic.Int64
	// refused holds when a probe was last refused (401, 403) under each
	// credential (an Authorization value, "" for none), for probeHoldOff:
	// such an answer says nothing of the era, and the same credential is
	// not sent to ask again before then.
	refused map[string]time.Time
}

// probeHoldOff spaces probes that a credential the upstream refused would
// send again: an agent that has not logged in yet costs the upstream one
// probe, not one per request.
const probeHoldOff = 10 * time.Second

// eraProbeTimeout bounds one server/discover probe.
const eraProbeTimeout = 5 * time.Second

// era returns the upstream's era, asking it first when unknown, with the
// agent's credential auth (its Authorization, or nil): an upstream that
// wants one answers the probe without it 401, which tells nothing of the
// era. A probe that gets no answer, or is refused, leaves it unknown, and
// the request passes through as it would directly (a session-era agent
// meets the outage there).
func (e *State) era(auth []byte) int { return e.Detect(true, auth) }

// Detect returns the upstream's era as era does; log says whether to log
// the era it detects.
func (e *State) Detect(log bool, auth []byte) int {
	if e.Cfg.EraBridge == "off" {
		return eraBoth // as if: nothing is bridged
	}
	if v := e.V.Load(); v != eraUnknown {
		return int(v)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if v := e.V.Load(); v != eraUnknown {
		return int(v)
	}
	if at := e.unanswered.Load(); at != 0 && time.Since(time.Unix(0, at)) < probeHoldOff {
		return eraUnknown
	}
	v, d := e.ask(auth)
	e.keep(d)
	if v != eraUnknown {
		e.V.Store(int32(v))
		if log {
			e.Log.Info().Str("era", EraNames[v]).Msg("upstream protocol era detected")
		}
	}
	return v
}

// keep holds what server/discover said, counted in the memory budget
// (its instructions may be large; each bridged initialize carries them).
func (e *State) keep(d *Discovery) {
	if d == nil {
		return
	}
	e.Mem.Charge(d.Size())
	if old := e.Info.Swap(d); old != nil {
		e.Mem.Give(old.Size())
	}
}

// Size is what a discovery is counted for.
func (d *Discovery) Size() int64 {
	return int64(len(d.Capabilities) + len(d.ServerInfo) + len(d.Instructions))
}

var EraNames = [...]string{"unknown", "session era only", "2026-07-28 only", "both eras (pass-through)"}

// forgetEra makes the next request ask again: the upstream restarted (a
// deploy may change its era) or answered as the other era does.
func (e *State) Forget() {
	if e.V.Swap(eraUnknown) != eraUnknown {
		e.Log.Info().Msg("upstream protocol era to be detected again")
	}
}

// recheckEra asks the era again in the background after an outage (the
// upstream may have been redeployed as another era); requests go on with
// the era known so far until it answers.
func (e *State) Recheck() {
	e.unanswered.Store(0) // unknown still: the next request asks
	if e.Cfg.EraBridge == "off" || e.V.Load() == eraUnknown || !e.rechecking.CompareAndSwap(false, true) {
		return
	}
	if !e.Bg.Add(1) {
		e.rechecking.Store(false)
		return
	}
	go func() {
		defer e.Bg.Done()
		defer e.rechecking.Store(false)
		e.mu.Lock()
		defer e.mu.Unlock()
		v, d, _ := e.probe(nil)
		if v == eraUnknown {
			return
		}
		e.keep(d)
		if old := e.V.Swap(int32(v)); int(old) != v {
			e.Log.Info().Str("era", EraNames[v]).Msg("upstream protocol era changed")
		}
	}()
}

// Bridged reports whether legacy agents of this upstream go through the
// bridge: when it speaks 2026-07-28 only, or (era_bridge prefer-2026) both
// eras.
func (e *State) Bridged(auth []byte) bool {
	switch e.Cfg.EraBridge {
	case conf.EraBridge2026:
		return false
	case conf.EraBridgePrefer2026:
		v := e.era(auth)
		return v == EraModern || v == eraBoth && e.Info.Load() != nil
	}
	return e.era(auth) == EraModern
}

// HeldRoute reports whether 2026-07-28 agents of this upstream go through
// the held route (held.go).
func (e *State) HeldRoute(auth []byte) bool {
	return e.Cfg.EraBridge != conf.EraBridgeLegacy && e.era(auth) == EraLegacy
}

// ask probes without the agent's credential first (the upstream's 401
// then tells that it judges credentials itself), then with it, skipping
// a credential refused within probeHoldOff. e.mu is held.
func (e *State) ask(auth []byte) (int, *Discovery) {
	now := time.Now()
	for k, at := range e.refused {
		if now.Sub(at) >= probeHoldOff {
			delete(e.refused, k)
		}
	}
	for i, cred := range [][]byte{nil, auth} {
		if i == 1 && (len(cred) == 0 || len(e.refused) >= maxRefused) {
			break // no credential; or many refused: not one probe per stranger
		}
		if _, held := e.refused[string(cred)]; held {
			continue
		}
		if v, d, refused := e.probe(cred); !refused {
			if v == eraUnknown {
				e.unanswered.Store(time.Now().UnixNano())
			}
			return v, d
		}
	}
	return eraUnknown, nil
}

// maxRefused bounds the credentials remembered as refused.
const maxRefused = 1024

// probe asks the upstream server/discover, under the agent's credential
// auth if any (mcpheal's own, if it owns the upstream's). A 2026-07-28
// server that lists no session-era version is eraModern; one that lists
// one serves legacy agents itself. A session-era server refuses the probe
// (400 "Server not initialized", a missing session id): eraLegacy. A 401,
// a 403 or a -32022 is no answer: eraUnknown, and that credential is not
// sent again for probeHoldOff. e.mu is held.
func (e *State) probe(auth []byte) (_ int, d *Discovery, refused bool) {
	var hdr *fasthttp.RequestHeader
	if len(auth) > 0 {
		hdr = &fasthttp.RequestHeader{}
		hdr.SetBytesKV(wire.HdrAuthorization, auth)
	}
	body := `{"jsonrpc":"2.0","id":` + e.Link.UpcallID("discover") + `,"method":"server/discover","params":{"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"` + wire.StatelessVersion + `",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"mcpheal","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`
	rep, err := e.Link.Call(&link.Upcall{Hdr: hdr, Body: []byte(body), Version: wire.StatelessVersion, McpMethod: "server/discover",
		Deadline: time.Now().Add(min(eraProbeTimeout, e.Cfg.ResponseTimeout))})
	if err != nil {
		return eraUnknown, nil, false
	}
	if rep.Session != "" {
		e.Link.DeleteLater(rep.Session, nil, true) // a session-era server opened one for the probe
	}
	if rep.Status == fasthttp.StatusUnauthorized {
		// The upstream wants a credential: it judges credentials itself
		// (binding.go).
		e.Link.JudgesCredentials.Store(true)
	}
	// A -32022 (this version unsupported) names the versions the server
	// does support (2026-07-28 basic/versioning; the Go SDK's server of the
	// session era answers so): none of 2026-07-28 says the session era.
	// One that names 2026-07-28 itself (a server may refuse the first
	// request it sees so, to test its clients' retry), or names none, says
	// nothing of the era; nor does a 401 or a 403.
	unsupported := gjson.GetBytes(rep.Msg, "error.code").Int() == -32022
	if unsupported {
		if v, ok := supportedEra(gjson.GetBytes(rep.Msg, "error.data.supported")); ok {
			return v, nil, false
		}
	}
	if rep.Status == fasthttp.StatusUnauthorized || rep.Status == fasthttp.StatusForbidden || unsupported {
		if e.refused == nil {
			e.refused = map[string]time.Time{}
		}
		e.refused[string(auth)] = time.Now()
		return eraUnknown, nil, true
	}
	if rep.Status >= 500 {
		return eraUnknown, nil, false
	}
	res := gjson.GetBytes(rep.Msg, "result")
	if rep.Status != fasthttp.StatusOK || !res.IsObject() {
		return EraLegacy, nil, false
	}
	modern, legacy := false, false
	for _, v := range res.Get("supportedVersions").Array() {
		if v.Str >= wire.StatelessVersion {
			modern = true
		} else {
			legacy = true
		}
	}
	if !modern {
		return EraLegacy, nil, false
	}
	d = &Discovery{Capabilities: []byte(res.Get("capabilities").Raw)}
	if len(d.Capabilities) == 0 {
		d.Capabilities = []byte("{}")
	}
	if si := res.Get(`_meta.io\.modelcontextprotocol/serverInfo`); si.IsObject() {
		d.ServerInfo = []byte(si.Raw)
	} else {
		d.ServerInfo = []byte(`{"name":"mcpheal-bridge","version":"1"}`)
	}
	if ins := res.Get("instructions"); ins.Type == gjson.String {
		d.Instructions = []byte(ins.Raw)
	}
	v := eraBoth
	if !legacy {
		// Listing only 2026-07-28 does not make a server of it alone: the
		// MCP Python SDK 2.x and FastMCP 4.x list only the era they belong
		// to, yet open a session for an initialize as well.
		v = e.servesSessions(auth)
	}
	if v == eraUnknown {
		return eraUnknown, nil, false
	}
	return v, d, false // what discover said is kept for era_bridge prefer-2026 too (bridged)
}

// supportedEra reads the data.supported list of a -32022 refusal: the
// session era when it names versions and none of 2026-07-28 or later; ok
// is false when it names none, or names 2026-07-28.
func supportedEra(list gjson.Result) (v int, ok bool) {
	n := 0
	for _, s := range list.Array() {
		if s.Type != gjson.String {
			continue
		}
		if s.Str >= wire.StatelessVersion {
			return eraUnknown, false
		}
		n++
	}
	return EraLegacy, n > 0
}

// eraProbeClient is the clientInfo name of servesSessions' initialize, by
// which a server's operator (and a test) tells it from an agent's.
const eraProbeClient = "mcpheal-era-probe"

// servesSessions tells the era of an upstream whose server/discover lists
// 2026-07-28 alone: eraBoth when it answers a session-era initialize with
// a session-era protocol version and an Mcp-Session-Id, and then a ping on
// that session (the session is DELETEd at once); eraModern when it answers
// otherwise (the Go SDK's server of 2026-07-28 alone answers the
// initialize without a session, and refuses what follows); eraUnknown
// when the initialize got no answer in time (a server slow to initialize
// is asked again by the next request, not taken for one of 2026-07-28
// alone). e.mu is held.
func (e *State) servesSessions(auth []byte) int {
	var hdr *fasthttp.RequestHeader
	if len(auth) > 0 {
		hdr = &fasthttp.RequestHeader{}
		hdr.SetBytesKV(wire.HdrAuthorization, auth)
	}
	deadline := time.Now().Add(min(eraProbeTimeout, e.Cfg.ResponseTimeout))
	// Mcp-Method too: a server of 2026-07-28 wants it on every POST, and
	// one of the session era ignores it.
	body := `{"jsonrpc":"2.0","id":` + e.Link.UpcallID("era") + `,"method":"initialize","params":{"protocolVersion":"` +
		wire.LegacyVersions[0] + `","capabilities":{},"clientInfo":{"name":"` + eraProbeClient + `","version":"1"}}}`
	rep, err := e.Link.Call(&link.Upcall{Hdr: hdr, Body: []byte(body), Deadline: deadline, Name: "initialize", McpMethod: "initialize"})
	switch {
	case rep.Status == 0 || rep.Status >= 500:
		return eraUnknown // no answer in time, or none of the server's
	case err != nil || rep.Session == "":
		return EraModern
	}
	defer e.Link.DeleteLater(rep.Session, auth, true)
	version := wire.InitializedVersion(rep.Status, rep.Msg)
	if version == "" || version >= wire.StatelessVersion {
		return EraModern
	}
	ping := `{"jsonrpc":"2.0","id":` + e.Link.UpcallID("era") + `,"method":"ping"}`
	rep, err = e.Link.Call(&link.Upcall{Hdr: hdr, Body: []byte(ping), Session: rep.Session, Version: version,
		Deadline: time.Now().Add(min(eraProbeTimeout, e.Cfg.ResponseTimeout)), Name: "ping", McpMethod: "ping"})
	switch {
	case rep.Status == 0 || rep.Status >= 500:
		return eraUnknown
	case err == nil && rep.Status == fasthttp.StatusOK && gjson.GetBytes(rep.Msg, "result").Exists():
		return eraBoth
	}
	return EraModern
}

// LegacyRefused reports an answer by which a 2026-07-28-only server refuses
// a session-era request: 400 with -32022 (unsupported protocol version), or
// the Go SDK's text/plain "Unsupported protocol version".
func LegacyRefused(status int, body []byte) bool {
	if status != fasthttp.StatusBadRequest {
		return false
	}
	if gjson.GetBytes(body, "error.code").Int() == -32022 {
		return true
	}
	return bytes.Contains(body, []byte("Unsupported protocol version"))
}

// ModernRefused reports an answer by which a session-era server refuses a
// 2026-07-28 request: it wants a session.
func ModernRefused(status int, body []byte) bool {
	return status == fasthttp.StatusBadRequest &&
		(bytes.Contains(body, []byte("Server not initialized")) || bytes.Contains(body, []byte("No valid session")) ||
			bytes.Contains(body, []byte("Mcp-Session-Id")))
}
