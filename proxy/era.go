package proxy

import (
	"bytes"
	"encoding/base64"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Protocol eras (README "Legacy agents, 2026-07-28 servers"). MCP
// 2026-07-28 removed sessions; a server that speaks only it refuses the
// session-era handshake, and the spec gives a legacy client no way
// forward. mcpheal asks each upstream which versions it speaks
// (server/discover) and, when none of them is of the session era, bridges
// its legacy agents (bridge.go): it keeps their sessions itself and speaks
// 2026-07-28 upstream.

const (
	eraUnknown = iota // not asked yet, or asked again after a restart
	eraLegacy         // the upstream serves session-era agents itself: pass through
	eraModern         // 2026-07-28 only: bridge legacy agents
)

// discovery is what server/discover told of a 2026-07-28 upstream.
type discovery struct {
	capabilities []byte // the result's capabilities object, raw JSON
	serverInfo   []byte // _meta["io.modelcontextprotocol/serverInfo"], raw JSON
	instructions []byte // raw JSON string, or nil
}

// eraState caches the upstream's era.
type eraState struct {
	v          atomic.Int32
	info       atomic.Pointer[discovery]
	mu         sync.Mutex  // one probe at a time
	rechecking atomic.Bool // a background recheck runs
}

// eraProbeTimeout bounds one server/discover probe.
const eraProbeTimeout = 5 * time.Second

// era returns the upstream's era, asking it first when unknown. A probe
// that gets no answer leaves it unknown (the request goes on as legacy and
// meets the outage there).
func (s *Server) era() int {
	if s.cfg.EraBridge == "off" {
		return eraLegacy
	}
	if v := s.eras.v.Load(); v != eraUnknown {
		return int(v)
	}
	s.eras.mu.Lock()
	defer s.eras.mu.Unlock()
	if v := s.eras.v.Load(); v != eraUnknown {
		return int(v)
	}
	v, d := s.probeEra()
	if d != nil {
		s.eras.info.Store(d)
	}
	if v != eraUnknown {
		s.eras.v.Store(int32(v))
		s.log.Info().Str("era", eraNames[v]).Msg("upstream protocol era detected")
	}
	return v
}

var eraNames = [...]string{"unknown", "session (pass-through)", "2026-07-28 only (bridged)"}

// forgetEra makes the next request ask again: the upstream restarted (a
// deploy may change its era) or answered as the other era does.
func (s *Server) forgetEra() {
	if s.eras.v.Swap(eraUnknown) != eraUnknown {
		s.log.Info().Msg("upstream protocol era to be detected again")
	}
}

// recheckEra asks the era again in the background after an outage (the
// upstream may have been redeployed as another era); requests go on with
// the era known so far until it answers.
func (s *Server) recheckEra() {
	if s.cfg.EraBridge == "off" || s.eras.v.Load() == eraUnknown || !s.eras.rechecking.CompareAndSwap(false, true) {
		return
	}
	if !s.bg.Add(1) {
		s.eras.rechecking.Store(false)
		return
	}
	go func() {
		defer s.bg.Done()
		defer s.eras.rechecking.Store(false)
		s.eras.mu.Lock()
		defer s.eras.mu.Unlock()
		v, d := s.probeEra()
		if v == eraUnknown {
			return
		}
		if d != nil {
			s.eras.info.Store(d)
		}
		if old := s.eras.v.Swap(int32(v)); int(old) != v {
			s.log.Info().Str("era", eraNames[v]).Msg("upstream protocol era changed")
		}
	}()
}

// bridged reports whether legacy agents of this upstream go through the
// bridge.
func (s *Server) bridged() bool { return s.era() == eraModern }

// probeEra asks the upstream server/discover. A 2026-07-28 server that
// lists no session-era version is eraModern; one that lists one serves
// legacy agents itself. A session-era server refuses the probe (400
// "Server not initialized", a missing session id): eraLegacy.
func (s *Server) probeEra() (int, *discovery) {
	body := `{"jsonrpc":"2.0","id":` + s.upcallID("discover") + `,"method":"server/discover","params":{"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"` + statelessVersion + `",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"mcpheal","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`
	rep, err := s.call(&upcall{body: []byte(body), version: statelessVersion, mcpMethod: "server/discover",
		deadline: time.Now().Add(min(eraProbeTimeout, s.cfg.ResponseTimeout))})
	if err != nil {
		return eraUnknown, nil
	}
	if rep.session != "" {
		s.deleteUpstream(rep.session, nil, true) // a session-era server opened one for the probe
	}
	if rep.status >= 500 {
		return eraUnknown, nil
	}
	res := gjson.GetBytes(rep.msg, "result")
	if rep.status != fasthttp.StatusOK || !res.IsObject() {
		return eraLegacy, nil
	}
	modern, legacy := false, false
	for _, v := range res.Get("supportedVersions").Array() {
		if v.Str >= statelessVersion {
			modern = true
		} else {
			legacy = true
		}
	}
	if !modern || legacy {
		return eraLegacy, nil
	}
	d := &discovery{capabilities: []byte(res.Get("capabilities").Raw)}
	if len(d.capabilities) == 0 {
		d.capabilities = []byte("{}")
	}
	if si := res.Get(`_meta.io\.modelcontextprotocol/serverInfo`); si.IsObject() {
		d.serverInfo = []byte(si.Raw)
	} else {
		d.serverInfo = []byte(`{"name":"mcpheal-bridge","version":"1"}`)
	}
	if ins := res.Get("instructions"); ins.Type == gjson.String {
		d.instructions = []byte(ins.Raw)
	}
	return eraModern, d
}

// legacyRefused reports an answer by which a 2026-07-28-only server refuses
// a session-era request: 400 with -32022 (unsupported protocol version), or
// the Go SDK's text/plain "Unsupported protocol version".
func legacyRefused(status int, body []byte) bool {
	if status != fasthttp.StatusBadRequest {
		return false
	}
	if gjson.GetBytes(body, "error.code").Int() == -32022 {
		return true
	}
	return bytes.Contains(body, []byte("Unsupported protocol version"))
}

// modernRefused reports an answer by which a session-era server refuses a
// 2026-07-28 request: it wants a session.
func modernRefused(status int, body []byte) bool {
	return status == fasthttp.StatusBadRequest &&
		(bytes.Contains(body, []byte("Server not initialized")) || bytes.Contains(body, []byte("No valid session")) ||
			bytes.Contains(body, []byte("Mcp-Session-Id")))
}

// mcpNameValue returns the Mcp-Name header value for v (2026-07-28
// streamable HTTP): as it is when it is safe visible ASCII, else
// =?base64?…?=.
func mcpNameValue(v string) string {
	safe := v != "" && v[0] != ' ' && v[len(v)-1] != ' ' && !strings.HasPrefix(v, "=?base64?")
	for i := 0; safe && i < len(v); i++ {
		safe = v[i] >= 0x20 && v[i] < 0x7f
	}
	if safe {
		return v
	}
	return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(v)) + "?="
}

// answers reports a JSON-RPC response (result or error) with the given
// raw id.
func answers(msg []byte, id string) bool {
	r := gjson.ParseBytes(msg)
	return r.Get("method").Type == gjson.Null && r.Get("id").Raw == id &&
		(r.Get("result").Exists() || r.Get("error").Exists())
}

// eraRefused reports an upstream answer that refuses the request as of the
// session era (legacyRefused); the era is then asked again.
func (a *attempt) eraRefused() bool {
	r := a.resp
	if r.StatusCode() != fasthttp.StatusBadRequest || r.IsStream() || !legacyRefused(fasthttp.StatusBadRequest, r.Body()) {
		return false
	}
	a.s.forgetEra()
	return true
}
