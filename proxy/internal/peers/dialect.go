package peers

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
)

// Dialect selects how a StartDialect peer answers a request that carries an
// unknown or forgotten Mcp-Session-Id.
type Dialect int

const (
	// DialectTS400: 400 application/json, -32000 "Bad Request: No valid
	// session ID provided", no "id" member (TS server-everything, §7).
	DialectTS400 Dialect = iota + 1
	// DialectWP200: HTTP 200 application/json, -32602 "Invalid params:
	// Invalid or expired session" with the request's id (WordPress
	// mcp-adapter, §2).
	DialectWP200
	// DialectSSE200: the DialectWP200 error framed as one SSE event in an
	// HTTP 200 text/event-stream answer. This dialect answers every request
	// with SSE.
	DialectSSE200
)

func (d Dialect) String() string {
	switch d {
	case DialectTS400:
		return "TS400"
	case DialectWP200:
		return "WP200"
	case DialectSSE200:
		return "SSE200"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// dialectExpired returns the exact answer a dialect peer gives to a POST
// carrying a forgotten or unknown session id. id is the request's raw
// JSON-RPC id (nil for a notification, which is rendered as null).
func dialectExpired(d Dialect, id json.RawMessage) (status int, contentType string, body []byte) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	wp := `{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params: Invalid or expired session"},"id":` + string(id) + `}`
	switch d {
	case DialectTS400:
		return http.StatusBadRequest, "application/json",
			[]byte(`{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"}}`)
	case DialectWP200:
		return http.StatusOK, "application/json", []byte(wp)
	case DialectSSE200:
		return http.StatusOK, "text/event-stream", []byte("event: message\ndata: " + wp + "\n\n")
	}
	panic("unknown dialect " + d.String())
}

// dialectMissing returns the answer to a non-initialize POST without an
// Mcp-Session-Id (the go-sdk client's server/discover probe is one): TS
// server-everything "Server not initialized", WordPress "Missing
// Mcp-Session-Id header". Both are 400 with a JSON-RPC error body, which makes
// the go-sdk client fall back to initialize.
func dialectMissing(d Dialect, id json.RawMessage) (status int, contentType string, body []byte) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	if d == DialectTS400 {
		return http.StatusBadRequest, "application/json",
			[]byte(`{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}`)
	}
	return http.StatusBadRequest, "application/json",
		[]byte(`{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid Request: Missing Mcp-Session-Id header"},"id":` + string(id) + `}`)
}

// ---------------------------------------------------------------------------
// dialect peer

// StartDialect starts a scripted MCP server (Streamable HTTP, session era)
// that answers:
//
//   - initialize: the requested protocolVersion, a fresh random
//     Mcp-Session-Id, tools capability;
//   - any other POST without an id: dialectMissing; with an unknown or
//     forgotten id: dialectExpired;
//   - on a live session: notifications and responses → 202; ping → {};
//     tools/list → the echo tool; tools/call echo {text} → text (counted in
//     ToolCalls("echo")); other tools → -32602; other methods → -32601;
//   - GET → 405; DELETE → 200 and the id is forgotten (unknown id:
//     dialectExpired).
//
// Success answers are application/json, except DialectSSE200 which frames
// every answer as one SSE event. Use Requests to see what it received.
func StartDialect(t testing.TB, d Dialect) *Server {
	t.Helper()
	return newPeer(t, "dialect-"+d.String(), func(p *Server, _ context.Context) *peerGen {
		g := &peerDialect{d: d, p: p, sessions: make(map[string]bool)}
		return &peerGen{handler: g, expire: g.forgetAll, close: g.forgetAll}
	})
}

type peerDialect struct {
	d Dialect
	p *Server

	mu       sync.Mutex // protects sessions
	sessions map[string]bool
}

func (g *peerDialect) forgetAll() {
	g.mu.Lock()
	clear(g.sessions)
	g.mu.Unlock()
}

func (g *peerDialect) known(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessions[id]
}

func (g *peerDialect) write(w http.ResponseWriter, status int, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// reply writes a JSON-RPC message in the dialect's framing.
func (g *peerDialect) reply(w http.ResponseWriter, msg []byte) {
	if g.d == DialectSSE200 {
		g.write(w, http.StatusOK, "text/event-stream", []byte("event: message\ndata: "+string(msg)+"\n\n"))
		return
	}
	g.write(w, http.StatusOK, "application/json", msg)
}

func (g *peerDialect) result(w http.ResponseWriter, id json.RawMessage, result string) {
	g.reply(w, []byte(`{"jsonrpc":"2.0","id":`+string(id)+`,"result":`+result+`}`))
}

func (g *peerDialect) rpcError(w http.ResponseWriter, id json.RawMessage, code int, msg string) {
	m, _ := json.Marshal(msg)
	g.reply(w, []byte(`{"jsonrpc":"2.0","id":`+string(id)+`,"error":{"code":`+strconv.Itoa(code)+`,"message":`+string(m)+`}}`))
}

func (g *peerDialect) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	switch r.Method {
	case http.MethodPost:
	case http.MethodDelete:
		g.mu.Lock()
		ok := g.sessions[sid]
		delete(g.sessions, sid)
		g.mu.Unlock()
		if !ok {
			st, ct, b := dialectExpired(g.d, nil)
			g.write(w, st, ct, b)
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	default:
		w.Header().Set("Allow", "POST, DELETE")
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		g.write(w, http.StatusBadRequest, "application/json",
			[]byte(`{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}`))
		return
	}
	if msg.Method == "initialize" {
		var params struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(msg.Params, &params)
		if params.ProtocolVersion == "" {
			params.ProtocolVersion = "2025-03-26"
		}
		id := rand.Text()
		g.mu.Lock()
		g.sessions[id] = true
		g.mu.Unlock()
		v, _ := json.Marshal(params.ProtocolVersion)
		w.Header().Set("Mcp-Session-Id", id)
		g.result(w, msg.ID, `{"protocolVersion":`+string(v)+`,"capabilities":{"tools":{}},"serverInfo":{"name":"peer-dialect-`+g.d.String()+`","version":"1.0.0"}}`)
		return
	}
	if sid == "" {
		st, ct, b := dialectMissing(g.d, msg.ID)
		g.write(w, st, ct, b)
		return
	}
	if !g.known(sid) {
		st, ct, b := dialectExpired(g.d, msg.ID)
		g.write(w, st, ct, b)
		return
	}
	if len(msg.ID) == 0 || msg.Method == "" { // notification or response
		w.WriteHeader(http.StatusAccepted)
		return
	}
	switch msg.Method {
	case "ping":
		g.result(w, msg.ID, `{}`)
	case "tools/list":
		g.result(w, msg.ID, `{"tools":[{"name":"echo","description":"returns text","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]}`)
	case "tools/call":
		var call struct {
			Name      string `json:"name"`
			Arguments struct {
				Text string `json:"text"`
			} `json:"arguments"`
		}
		_ = json.Unmarshal(msg.Params, &call)
		if call.Name != "echo" {
			g.rpcError(w, msg.ID, -32602, "Unknown tool: "+call.Name)
			return
		}
		g.p.countTool("echo")
		text, _ := json.Marshal(call.Arguments.Text)
		g.result(w, msg.ID, `{"content":[{"type":"text","text":`+string(text)+`}]}`)
	default:
		g.rpcError(w, msg.ID, -32601, "Method not found")
	}
}
