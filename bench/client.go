package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"
)

// ProtocolVersion is the MCP version the benchmark client asks for.
const ProtocolVersion = "2025-06-18"

// Session is an initialized MCP session as the load generator sees it.
type Session struct {
	// URL is the endpoint the session lives on.
	URL string
	// ID is the Mcp-Session-Id to send; empty for a stateless server.
	ID string
	// Protocol is the negotiated protocol version.
	Protocol string
	// Auth is the Authorization header every request carries; empty for
	// none (a gateway in front of the upstream may want a bearer token).
	Auth string
	// Tool is the name the echo tool is called by; empty for EchoTool (a
	// gateway that federates the upstream may prefix its tools' names).
	Tool string
}

// ToolName is the name s calls the echo tool by.
func (s Session) ToolName() string {
	if s.Tool == "" {
		return EchoTool
	}
	return s.Tool
}

// Header returns the headers every request of the session carries.
func (s Session) Header() http.Header {
	h := http.Header{
		"Content-Type":         {"application/json"},
		"Accept":               {"application/json, text/event-stream"},
		"Mcp-Protocol-Version": {s.Protocol},
	}
	if s.ID != "" {
		h["Mcp-Session-Id"] = []string{s.ID}
	}
	if s.Auth != "" {
		h["Authorization"] = []string{s.Auth}
	}
	return h
}

var initBody = []byte(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"` +
	ProtocolVersion + `","capabilities":{},"clientInfo":{"name":"mcpbench","version":"1"}}}`)

// Initialize opens a session on url as an agent does: initialize,
// notifications/initialized, then tools/list (which also lets a proxy learn
// that the echo tool is read-only). With full unset it sends initialize only.
func Initialize(ctx context.Context, hc *http.Client, url string, full bool) (Session, error) {
	return InitializeAs(ctx, hc, Session{URL: url}, full)
}

// InitializeAs is Initialize with the Authorization header and the echo
// tool's name of s (its URL, Auth and Tool); the session it returns keeps
// them.
func InitializeAs(ctx context.Context, hc *http.Client, s Session, full bool) (Session, error) {
	s.ID, s.Protocol = "", ProtocolVersion
	st, hdr, body, err := s.post(ctx, hc, initBody)
	if err != nil {
		return s, fmt.Errorf("initialize: %w", err)
	}
	ans := Answer(body)
	s.Protocol = gjson.GetBytes(ans, "result.protocolVersion").Str
	if st != http.StatusOK || s.Protocol == "" {
		return s, fmt.Errorf("initialize: status %d: %.200s", st, body)
	}
	s.ID = hdr.Get("Mcp-Session-Id")
	if !full {
		return s, nil
	}
	if st, _, body, err = s.post(ctx, hc, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil || st/100 != 2 {
		return s, fmt.Errorf("notifications/initialized: status %d %.200s: %v", st, body, err)
	}
	st, hdr, body, err = s.post(ctx, hc, []byte(`{"jsonrpc":"2.0","id":"tools","method":"tools/list"}`))
	if err != nil || st != http.StatusOK {
		return s, fmt.Errorf("tools/list: status %d %.200s: %v", st, body, err)
	}
	if !gjson.GetBytes(Answer(body), `result.tools.#(name=="`+s.ToolName()+`")`).Exists() {
		return s, fmt.Errorf("tools/list: no %s tool in %.200s", s.ToolName(), body)
	}
	return s, nil
}

// Call sends one echo call with the given id and checks its answer.
func (s Session) Call(ctx context.Context, hc *http.Client, id uint64) error {
	st, _, body, err := s.post(ctx, hc, AppendToolCallBody(nil, id, s.ToolName()))
	if err != nil {
		return err
	}
	if st != http.StatusOK {
		return fmt.Errorf("echo %d: status %d: %.200s", id, st, body)
	}
	got, err := CheckEcho(body)
	if err == nil && got != id {
		err = fmt.Errorf("echo %d: answer carries id %d", id, got)
	}
	return err
}

// Delete ends the session (best effort).
func (s Session) Delete(ctx context.Context, hc *http.Client) {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, s.URL, nil)
	if err != nil {
		return
	}
	req.Header = s.Header()
	if resp, err := hc.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

func (s Session) post(ctx context.Context, hc *http.Client, body []byte) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header = s.Header()
	if s.ID == "" {
		req.Header.Del("Mcp-Protocol-Version")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// CallBody returns the tools/call request with JSON-RPC id id, whose echo
// text is EchoText(id).
func CallBody(id uint64) []byte {
	return AppendCallBody(nil, id)
}

// AppendCallBody appends CallBody(id) to dst.
func AppendCallBody(dst []byte, id uint64) []byte {
	return AppendToolCallBody(dst, id, EchoTool)
}

// AppendToolCallBody appends CallBody(id) with the echo tool called tool
// (a name without characters JSON escapes) to dst.
func AppendToolCallBody(dst []byte, id uint64, tool string) []byte {
	dst = append(dst, `{"jsonrpc":"2.0","id":`...)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, `,"method":"tools/call","params":{"name":"`...)
	dst = append(dst, tool...)
	dst = append(dst, `","arguments":{"text":"bench-`...)
	dst = strconv.AppendUint(dst, id, 10)
	return append(dst, `"}}}`...)
}
