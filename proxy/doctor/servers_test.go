package doctor

// MCP servers for the doctor's tests, on 127.0.0.1, stopped in t.Cleanup:
// the official Go SDK (go-sdk v1.8.0) and mark3labs/mcp-go v1.2.1 in
// process, and a scripted server for a dialect no SDK produces (WordPress
// mcp-adapter's HTTP 200 -32602). Each one counts the initialize requests
// it receives and the size of its largest answer to each JSON-RPC method.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpgoserver "github.com/mark3labs/mcp-go/server"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// testTimeout bounds every wait in these tests.
const testTimeout = 20 * time.Second

// server is a running MCP server.
type server struct {
	URL   string // the MCP endpoint, http://127.0.0.1:port/mcp
	inits atomic.Int64

	mu      sync.Mutex     // protects written
	written map[string]int // largest answer body per JSON-RPC method, in bytes
}

// Inits counts initialize requests received.
func (s *server) Inits() int64 { return s.inits.Load() }

// Written returns the size of the largest answer body to method.
func (s *server) Written(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written[method]
}

// serve runs h on 127.0.0.1 behind a recorder of initialize requests and
// answer sizes.
func serve(t testing.TB, h http.Handler) *server {
	t.Helper()
	s := &server{written: make(map[string]int)}
	rec := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var method string
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var m struct {
				Method string `json:"method"`
			}
			_ = json.Unmarshal(body, &m)
			if method = m.Method; method == "initialize" {
				s.inits.Add(1)
			}
		}
		h.ServeHTTP(&countingWriter{ResponseWriter: w, s: s, method: method}, r)
	})
	hs := httptest.NewUnstartedServer(rec)
	hs.Config.ErrorLog = log.New(io.Discard, "", 0)
	hs.Start()
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
	})
	s.URL = hs.URL + "/mcp"
	return s
}

// countingWriter counts the body bytes of an answer into s.written as they
// are written, before they can reach the client: a count taken when the
// handler returns raced with a test that reads it as soon as it has its
// answer (the Go SDK ends the stream after the response event). It keeps
// Flush, which the SDKs need to stream SSE.
type countingWriter struct {
	http.ResponseWriter
	s      *server
	method string
	n      int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n += n
	w.s.mu.Lock()
	w.s.written[w.method] = max(w.s.written[w.method], w.n)
	w.s.mu.Unlock()
	return n, err
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// goSDKOpts configures startGoSDK; the zero value is a stateful server
// answering with text/event-stream and four tools.
type goSDKOpts struct {
	Stateless    bool // StreamableHTTPOptions.Stateless: no Mcp-Session-Id, GET/DELETE 405
	JSONResponse bool // StreamableHTTPOptions.JSONResponse: application/json answers
	// Tools is the number of tools (zero: 4). Every fourth one, from the
	// fourth, has readOnlyHint; each has a description of descLen bytes.
	Tools int
	// Pieces > 0 sends the answer to tools/list in writes of that many
	// bytes, each flushed; Cut drops its last byte, so that the answer ends
	// inside its event.
	Pieces int
	Cut    bool
}

// descLen is the length of each go-sdk tool's description: 40 tools make
// a tools/list answer of about 24 KB.
const descLen = 480

type noInput struct{}

// startGoSDK starts a go-sdk server (mcp.NewServer behind
// mcp.NewStreamableHTTPHandler).
func startGoSDK(t testing.TB, o goSDKOpts) *server {
	t.Helper()
	if o.Tools == 0 {
		o.Tools = 4
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "test-go-sdk", Version: "1.0.0"}, nil)
	desc := strings.Repeat("a tool the doctor counts; ", descLen/26+1)[:descLen]
	for i := range o.Tools {
		tool := &mcp.Tool{Name: fmt.Sprintf("tool_%02d", i), Description: desc}
		if i%4 == 3 {
			tool.Annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
		}
		mcp.AddTool(srv, tool, func(context.Context, *mcp.CallToolRequest, noInput) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
		})
	}
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: o.Stateless, JSONResponse: o.JSONResponse})
	if o.Pieces > 0 {
		h = piecewise(h, "tools/list", o.Pieces, o.Cut)
	}
	s := serve(t, h)
	t.Cleanup(func() {
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
	})
	return s
}

// piecewise has h answer POSTs of the JSON-RPC method in writes of size
// bytes, each flushed, as a server streaming a large answer does; with cut
// the last byte is never sent.
func piecewise(h http.Handler, method string, size int, cut bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !bytes.Contains(body, []byte(`"method":"`+method+`"`)) {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		b := rec.Body.Bytes()
		if cut {
			b = b[:len(b)-1]
		}
		rc := http.NewResponseController(w)
		for len(b) > 0 {
			n := min(size, len(b))
			_, _ = w.Write(b[:n])
			_ = rc.Flush()
			b = b[n:]
		}
	})
}

// startMCPGo starts an mcp-go server with one echo tool. stateful is
// server.WithStateful(true) (an unknown id: 404 text/plain "Invalid session
// ID") with only the session-era protocol versions, so that
// server/discover is not accepted; !stateful is mcp-go's default, which
// accepts any well-formed session id (expiry is invisible).
func startMCPGo(t testing.TB, stateful bool) *server {
	t.Helper()
	s := mcpgoserver.NewMCPServer("test-mcp-go", "1.0.0", mcpgoserver.WithToolCapabilities(false))
	s.AddTool(mcpgo.NewTool("echo", mcpgo.WithDescription("returns text"), mcpgo.WithString("text", mcpgo.Required())),
		func(_ context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
			return mcpgo.NewToolResultText(req.GetString("text", "")), nil
		})
	opts := []mcpgoserver.StreamableHTTPOption{mcpgoserver.WithStreamableHTTPLogger(slog.New(slog.DiscardHandler))}
	if stateful {
		opts = append(opts, mcpgoserver.WithStateful(true), mcpgoserver.WithStreamableHTTPProtocolVersions(
			mcpgo.ProtocolVersion20251125, mcpgo.ProtocolVersion20250618, mcpgo.ProtocolVersion20250326))
	}
	h := mcpgoserver.NewStreamableHTTPServer(s, opts...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_ = h.Shutdown(ctx)
	})
	return serve(t, h)
}

// startWordPress starts a scripted session-era server that answers a
// request with an unknown session id like WordPress mcp-adapter: HTTP 200
// application/json, -32602 "Invalid params: Invalid or expired session"
// with the request's id. It knows initialize (a fresh rand.Text session
// id), ping, tools/list (one tool) and DELETE; GET is 405.
func startWordPress(t testing.TB) *server {
	t.Helper()
	return serve(t, &wordPress{sessions: make(map[string]bool)})
}

// wordPress is startWordPress's handler.
type wordPress struct {
	mu       sync.Mutex // protects sessions
	sessions map[string]bool
}

func (s *wordPress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	switch r.Method {
	case http.MethodPost:
		s.post(w, r, sid)
	case http.MethodDelete:
		s.mu.Lock()
		delete(s.sessions, sid)
		s.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	default:
		w.Header().Set("Allow", "POST, DELETE")
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	}
}

func (s *wordPress) post(w http.ResponseWriter, r *http.Request, sid string) {
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		reply(w, http.StatusBadRequest, `{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}`)
		return
	}
	id := string(msg.ID)
	if id == "" {
		id = "null"
	}
	s.mu.Lock()
	known := s.sessions[sid]
	s.mu.Unlock()
	switch {
	case msg.Method == "initialize":
		sid := rand.Text()
		s.mu.Lock()
		s.sessions[sid] = true
		s.mu.Unlock()
		v, _ := json.Marshal(msg.Params.ProtocolVersion)
		w.Header().Set("Mcp-Session-Id", sid)
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{"protocolVersion":`+string(v)+
			`,"capabilities":{"tools":{}},"serverInfo":{"name":"test-wordpress","version":"1.0.0"}}}`)
	case sid == "":
		reply(w, http.StatusBadRequest, `{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid Request: Missing Mcp-Session-Id header"},"id":`+id+`}`)
	case !known:
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params: Invalid or expired session"},"id":`+id+`}`)
	case msg.ID == nil:
		w.WriteHeader(http.StatusAccepted)
	case msg.Method == "ping":
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{}}`)
	case msg.Method == "tools/list":
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}}`)
	default:
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32601,"message":"Method not found"}}`)
	}
}

// reply writes a JSON answer.
func reply(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// serveRewritten serves a reverse proxy to upstream on 127.0.0.1 that passes
// everything through except POST answers to requests with a session id,
// which rewrite may replace.
func serveRewritten(t testing.TB, upstream string, rewrite func(status int, body []byte) (int, []byte, bool)) string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{}, Timeout: testTimeout}
	t.Cleanup(c.CloseIdleConnections)
	s := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, upstream, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := c.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") != "" {
			rb, _ := io.ReadAll(resp.Body)
			if st, nb, ok := rewrite(resp.StatusCode, rb); ok {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Del("Content-Length")
				w.WriteHeader(st)
				_, _ = w.Write(nb)
				return
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(rb)
			return
		}
		w.WriteHeader(resp.StatusCode)
		http.NewResponseController(w).Flush()
		_, _ = io.Copy(w, resp.Body)
	}))
	return s.URL
}
