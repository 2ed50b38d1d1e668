package bench

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// EchoTool is the name of the benchmark upstream's only tool.
const EchoTool = "echo"

// Echo is the benchmark upstream: the official Go SDK Streamable HTTP server,
// stateful, with one tool that returns its "text" argument as text content.
// The tool is annotated readOnlyHint (an echo changes nothing), so a proxy
// that learned it from tools/list may replay it.
type Echo struct {
	// Handler serves the MCP endpoint.
	Handler http.Handler

	srv   *mcp.Server
	inits atomic.Int64 // initialize requests received
}

// NewEcho returns an Echo answering POSTs with application/json when
// jsonResponse is set, and with text/event-stream otherwise.
func NewEcho(jsonResponse bool) *Echo {
	e := &Echo{srv: mcp.NewServer(&mcp.Implementation{Name: "bench-echo", Version: "1"}, nil)}
	e.srv.AddTool(&mcp.Tool{
		Name:        EchoTool,
		Description: "Returns its text argument.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true},
	}, echoTool)
	e.srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "initialize" {
				e.inits.Add(1)
			}
			return next(ctx, method, req)
		}
	})
	e.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return e.srv },
		&mcp.StreamableHTTPOptions{JSONResponse: jsonResponse})
	return e
}

func echoTool(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
		return nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: args.Text}}}, nil
}

// Initializes returns how many initialize requests the server has received.
func (e *Echo) Initializes() int64 { return e.inits.Load() }

// Sessions returns the number of live sessions.
func (e *Echo) Sessions() int {
	n := 0
	for range e.srv.Sessions() {
		n++
	}
	return n
}

// ExpireAll closes every live session at once, as a server whose sessions
// time out together would; later requests on them get the SDK's 404
// "session not found". It returns how many sessions it closed.
func (e *Echo) ExpireAll() int {
	var all []*mcp.ServerSession
	for ss := range e.srv.Sessions() {
		all = append(all, ss)
	}
	for _, ss := range all {
		_ = ss.Close()
	}
	return len(all)
}
