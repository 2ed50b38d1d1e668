//go:build unix

package interop

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// result is what an agent saw for one operation, the same shape for every
// client: testdata/client.mjs prints it, mcp-remote's raw answers are
// reduced to it. Lengths are UTF-8 bytes.
type result struct {
	Op      string `json:"op"`
	OK      bool   `json:"ok"`
	Code    *int   `json:"code"` // JSON-RPC error code (an HTTP status for the SDKs' HTTP errors)
	Message string `json:"message"`
	Kind    string `json:"kind"` // the error's class, or "timeout"

	ServerName         string `json:"serverName"`
	InstructionsLen    int    `json:"instructionsLen"`
	InstructionsSha256 string `json:"instructionsSha256"`

	Count int      `json:"count"`
	Names []string `json:"names"`

	IsError    bool   `json:"isError"`
	TextLen    int    `json:"textLen"`
	TextSha256 string `json:"textSha256"`
	TextHead   string `json:"textHead"`
}

func (r result) String() string {
	if r.OK {
		return fmt.Sprintf("%s ok", r.Op)
	}
	code := "none"
	if r.Code != nil {
		code = strconv.Itoa(*r.Code)
	}
	return fmt.Sprintf("%s failed: code %s, %s: %s", r.Op, code, r.Kind, r.Message)
}

// hasCode says whether r is an error with JSON-RPC code c.
func (r result) hasCode(c int) bool { return !r.OK && r.Code != nil && *r.Code == c }

// agent is one MCP client session, driven one operation at a time.
type agent interface {
	connect() result
	list() result
	call(name string, args map[string]any) result
	// callAsync sends a tools/call and returns a function that waits for
	// its answer.
	callAsync(name string, args map[string]any) func() result
}

// flavours are the clients every scenario runs.
var flavours = []string{"ts-sdk-v1", "ts-sdk-v2", "mcp-remote"}

// newAgent starts a client of the given flavour for url; name is the
// clientInfo name the server sees.
func newAgent(t testing.TB, flavour, url, name string) agent {
	t.Helper()
	switch flavour {
	case "ts-sdk-v1":
		return startSDKClient(t, "v1", url, name)
	case "ts-sdk-v2":
		return startSDKClient(t, "v2", url, name)
	case "mcp-remote":
		return startRemote(t, url, name)
	}
	t.Fatalf("unknown client %q", flavour)
	return nil
}

// sdkClient is testdata/client.mjs: the TS SDK's Client and
// StreamableHTTPClientTransport (v1 @modelcontextprotocol/sdk, v2
// @modelcontextprotocol/client).
type sdkClient struct {
	t    testing.TB
	p    *nodeProc
	next int // first stdout line not yet consumed
}

func startSDKClient(t testing.TB, version, url, name string) *sdkClient {
	t.Helper()
	env := []string{"CLIENT_NAME=" + name, fmt.Sprintf("REQUEST_TIMEOUT_MS=%d", sdkTimeout.Milliseconds())}
	return &sdkClient{t: t, p: startNode(t, "client-"+version+" "+name, env, "client.mjs", version, url)}
}

func (c *sdkClient) send(cmd map[string]any) {
	c.t.Helper()
	b, err := json.Marshal(cmd)
	if err != nil {
		c.t.Fatal(err)
	}
	c.p.send(c.t, b)
}

func (c *sdkClient) wait(op string) result {
	c.t.Helper()
	i, line, ok := c.p.out.waitFor(c.next, opTimeout, func(l string) bool { return strings.HasPrefix(l, "RESULT ") })
	if !ok {
		return result{Op: op, Kind: "timeout", Message: fmt.Sprintf("no answer within %v; client stderr:\n%s", opTimeout, c.p.stderr.String())}
	}
	c.next = i + 1
	var r result
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &r); err != nil {
		c.t.Fatalf("client output %q: %v", line, err)
	}
	return r
}

func (c *sdkClient) do(cmd map[string]any) result {
	c.t.Helper()
	c.send(cmd)
	return c.wait(cmd["op"].(string))
}

func (c *sdkClient) connect() result { return c.do(map[string]any{"op": "connect"}) }
func (c *sdkClient) list() result    { return c.do(map[string]any{"op": "list"}) }

func (c *sdkClient) call(name string, args map[string]any) result {
	return c.callAsync(name, args)()
}

func (c *sdkClient) callAsync(name string, args map[string]any) func() result {
	c.send(map[string]any{"op": "call", "name": name, "arguments": args})
	return func() result { return c.wait("call") }
}

// remote is mcp-remote, the stdio↔Streamable HTTP bridge desktop hosts run:
// the test writes JSON-RPC lines to its stdin as a stdio host would and
// reads its stdout.
type remote struct {
	t      testing.TB
	p      *nodeProc
	name   string
	lastID int
}

func startRemote(t testing.TB, url, name string) *remote {
	t.Helper()
	// MCP_REMOTE_CONFIG_DIR keeps its OAuth state away from ~/.mcp-auth.
	env := []string{"MCP_REMOTE_CONFIG_DIR=" + t.TempDir()}
	p := startNode(t, "mcp-remote "+name, env, "node_modules/mcp-remote/dist/proxy.js", url, "--transport", "http-only")
	return &remote{t: t, p: p, name: name}
}

// rpcMessage is one JSON-RPC line from mcp-remote's stdout.
type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// request sends a request and returns a function that waits for the answer
// with its id (a stdio host matches answers by id too). A nil message means
// no answer within opTimeout.
func (r *remote) request(method string, params any) func() (*rpcMessage, int) {
	r.t.Helper()
	r.lastID++
	id := strconv.Itoa(r.lastID)
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": r.lastID, "method": method, "params": params})
	if err != nil {
		r.t.Fatal(err)
	}
	r.p.send(r.t, b)
	return func() (*rpcMessage, int) {
		var m rpcMessage
		_, line, ok := r.p.out.waitFor(0, opTimeout, func(l string) bool {
			var probe struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			return json.Unmarshal([]byte(l), &probe) == nil && probe.Method == "" && string(probe.ID) == id
		})
		if !ok {
			return nil, 0
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			r.t.Fatalf("mcp-remote output: %v", err)
		}
		return &m, len(line)
	}
}

// toResult reduces an answer to a result; fill reads a successful one.
func (r *remote) toResult(op string, m *rpcMessage, fill func(*result) error) result {
	if m == nil {
		return result{Op: op, Kind: "timeout", Message: fmt.Sprintf("no answer within %v; mcp-remote stderr:\n%s", opTimeout, r.p.stderr.String())}
	}
	if m.Error != nil {
		code := m.Error.Code
		return result{Op: op, Code: &code, Kind: "JSON-RPC error", Message: m.Error.Message}
	}
	res := result{Op: op, OK: true}
	if err := fill(&res); err != nil {
		return result{Op: op, Kind: "bad result", Message: err.Error()}
	}
	return res
}

func (r *remote) connect() result {
	m, _ := r.request("initialize", map[string]any{
		"protocolVersion": "2025-11-25",
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]any{"name": r.name, "version": "1.0.0"},
	})()
	res := r.toResult("connect", m, func(res *result) error {
		var v struct {
			ServerInfo   struct{ Name string } `json:"serverInfo"`
			Instructions string                `json:"instructions"`
		}
		if err := json.Unmarshal(m.Result, &v); err != nil {
			return err
		}
		res.ServerName = v.ServerInfo.Name
		res.InstructionsLen, res.InstructionsSha256 = digest(v.Instructions)
		return nil
	})
	if res.OK {
		b := []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		r.p.send(r.t, b)
	}
	return res
}

func (r *remote) list() result {
	var names []string
	cursor := ""
	for {
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		m, _ := r.request("tools/list", params)()
		var next string
		res := r.toResult("list", m, func(*result) error {
			var v struct {
				Tools      []struct{ Name string } `json:"tools"`
				NextCursor string                  `json:"nextCursor"`
			}
			if err := json.Unmarshal(m.Result, &v); err != nil {
				return err
			}
			for _, tool := range v.Tools {
				names = append(names, tool.Name)
			}
			next = v.NextCursor
			return nil
		})
		if !res.OK || next == "" {
			res.Names, res.Count = names, len(names)
			return res
		}
		cursor = next
	}
}

func (r *remote) call(name string, args map[string]any) result {
	return r.callAsync(name, args)()
}

func (r *remote) callAsync(name string, args map[string]any) func() result {
	wait := r.request("tools/call", map[string]any{"name": name, "arguments": args})
	return func() result {
		m, _ := wait()
		return r.toResult("call", m, func(res *result) error {
			var v struct {
				IsError bool `json:"isError"`
				Content []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
			}
			if err := json.Unmarshal(m.Result, &v); err != nil {
				return err
			}
			var text strings.Builder
			for _, c := range v.Content {
				if c.Type == "text" {
					text.WriteString(c.Text)
				}
			}
			res.IsError = v.IsError
			res.TextLen, res.TextSha256 = digest(text.String())
			res.TextHead = text.String()[:min(200, text.Len())]
			return nil
		})
	}
}

// digest is a string's UTF-8 length and SHA-256, as client.mjs computes them.
func digest(s string) (int, string) {
	h := sha256.Sum256([]byte(s))
	return len(s), hex.EncodeToString(h[:])
}
