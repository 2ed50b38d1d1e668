package peers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ---------------------------------------------------------------------------
// go-sdk peer

type EchoIn struct {
	Text string `json:"text"`
}

type SlowIn struct {
	Steps   int `json:"steps"`
	DelayMs int `json:"delayMs"`
}

type NoIn struct{}

// StartGoSDK starts a go-sdk v1.8.0 server (mcp.NewServer behind
// mcp.NewStreamableHTTPHandler) with these tools:
//
//   - echo {text}: returns text;
//   - slow {steps, delayMs}: sends steps progress notifications (progress
//     1..steps, total steps) delayMs apart on the request's progress token,
//     then returns "done";
//   - counter {} (no annotations, so not idempotent): increments the shared
//     counter and returns its new value as text, see Server.KillOnCounter;
//   - ro_counter {} (ReadOnlyHint): same, same counter.
//
// With o.State it also has the session-state features:
//
//   - resources: ResourceURI is listed and readable, and a
//     resources/subscribe to any URI is accepted (SubscribeHandler), so
//     UpdateResource reaches the sessions subscribed to it;
//   - log {level, text}: logs text at level through the calling session,
//     on the call's own stream (sent only at or above the session's
//     logging/setLevel, none before one), then returns "logged";
//   - sample {prompt}: asks the client for sampling/createMessage with
//     prompt as the user message, on the call's stream, and returns the text
//     the client sampled; it gives up after Timeout or when the
//     generation stops (ExpireSessions waits for it like for any handler).
//
// SetNextTools changes the tool list of later generations.
func StartGoSDK(t testing.TB, o GoSDKOpts) *Server {
	t.Helper()
	return newPeer(t, "go-sdk", func(p *Server, genCtx context.Context) *peerGen {
		sopts := &mcp.ServerOptions{SupportedProtocolVersions: o.Versions}
		if o.State {
			sopts.SubscribeHandler = func(context.Context, *mcp.SubscribeRequest) error { return nil }
			sopts.UnsubscribeHandler = func(context.Context, *mcp.UnsubscribeRequest) error { return nil }
		}
		srv := mcp.NewServer(&mcp.Implementation{Name: "peer-go-sdk", Version: "1.0.0"}, sopts)
		p.addGoSDKTools(srv, genCtx)
		if o.State {
			p.addGoSDKState(srv, genCtx)
		}
		if o.Polls {
			p.addGoSDKPoll(srv)
		}
		p.applyNextTools(srv)
		hopts := &mcp.StreamableHTTPOptions{
			Stateless:      o.Stateless,
			JSONResponse:   o.JSONResponse,
			SessionTimeout: o.SessionTimeout,
		}
		if o.EventStore {
			hopts.EventStore = mcp.NewMemoryEventStore(nil)
		}
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, hopts)
		closeAll := func() {
			for ss := range srv.Sessions() {
				_ = ss.Close()
			}
		}
		return &peerGen{handler: h, expire: closeAll, close: closeAll, sdk: srv}
	})
}

func Text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func (p *Server) addGoSDKTools(srv *mcp.Server, genCtx context.Context) {
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Description: "returns text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in EchoIn) (*mcp.CallToolResult, any, error) {
			p.countTool("echo")
			return Text(in.Text), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "slow", Description: "progress steps, then done"},
		func(ctx context.Context, req *mcp.CallToolRequest, in SlowIn) (*mcp.CallToolResult, any, error) {
			p.countTool("slow")
			tok := req.Params.GetProgressToken()
			for i := 1; i <= in.Steps; i++ {
				if in.DelayMs > 0 {
					tm := time.NewTimer(time.Duration(in.DelayMs) * time.Millisecond)
					select {
					case <-tm.C:
					case <-ctx.Done():
						tm.Stop()
						return nil, nil, ctx.Err()
					case <-genCtx.Done():
						tm.Stop()
						return nil, nil, errors.New("server stopped")
					}
				}
				if tok == nil {
					continue
				}
				err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: tok,
					Progress:      float64(i),
					Total:         float64(in.Steps),
					Message:       fmt.Sprintf("step %d/%d", i, in.Steps),
				})
				if err != nil {
					return nil, nil, err
				}
			}
			return Text("done"), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "counter", Description: "increments a counter (not idempotent)"},
		func(context.Context, *mcp.CallToolRequest, NoIn) (*mcp.CallToolResult, any, error) {
			return Text(strconv.FormatInt(p.bumpCounter("counter"), 10)), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "ro_counter",
		Description: "increments a counter, but claims to be read-only",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(context.Context, *mcp.CallToolRequest, NoIn) (*mcp.CallToolResult, any, error) {
		return Text(strconv.FormatInt(p.bumpCounter("ro_counter"), 10)), nil, nil
	})
}

// peerSchema is an elicitation's schema: one string property.
func peerSchema(prop string) map[string]any {
	return map[string]any{"type": "object", "properties": map[string]any{prop: map[string]any{"type": "string"}}}
}

// peerAsk is the ask tool of a State go-sdk peer: it asks for input the
// way the Go SDK's multi-round input requests do (the SDK serves them to a
// session-era client as concurrent server requests, and hands the
// handler's second round back in its result): round 1 asks for a name
// (elicitation), a greeting (sampling) and the roots at once; round 2,
// given all three, asks for a colour with requestState "round2:<name>";
// given the colour and that state, it completes (counted as "ask").
func (p *Server) peerAsk(_ context.Context, req *mcp.CallToolRequest, _ NoIn) (*mcp.CallToolResult, any, error) {
	in := req.Params.InputResponses
	if st, ok := strings.CutPrefix(req.Params.RequestState, "round2:"); ok {
		colour := ""
		if e, ok := in["colour"].(*mcp.ElicitResult); ok && e.Action == "accept" {
			colour, _ = e.Content["colour"].(string)
		}
		if colour == "" {
			return nil, nil, errors.New("round 2 without a colour")
		}
		p.countTool("ask")
		return Text(st + " likes " + colour), nil, nil
	}
	name, _ := in["name"].(*mcp.ElicitResult)
	_, greeted := in["greeting"].(*mcp.CreateMessageWithToolsResult)
	_, rooted := in["roots"].(*mcp.ListRootsResult)
	if name == nil || name.Action != "accept" || !greeted || !rooted {
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
			"name": &mcp.ElicitParams{Message: "name?", RequestedSchema: peerSchema("name")},
			"greeting": &mcp.CreateMessageParams{MaxTokens: 8,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "greet"}}}},
			"roots": &mcp.ListRootsParams{},
		}}, nil, nil
	}
	who, _ := name.Content["name"].(string)
	return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
		"colour": &mcp.ElicitParams{Message: "colour?", RequestedSchema: peerSchema("colour")},
	}, RequestState: "round2:" + who}, nil, nil
}

// ResourceURI is the resource a State go-sdk peer lists.
const ResourceURI = "test://peer/resource"

type peerLogIn struct {
	Level string `json:"level"`
	Text  string `json:"text"`
}

type peerSampleIn struct {
	Prompt string `json:"prompt"`
}

// addGoSDKPoll adds the o.Polls tool.
func (p *Server) addGoSDKPoll(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "poll", Description: "closes its answer stream on purpose, then answers"},
		func(ctx context.Context, req *mcp.CallToolRequest, in peerPollIn) (*mcp.CallToolResult, any, error) {
			p.countTool("poll")
			for i := 1; i <= in.Times; i++ {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: "poll",
					Progress: float64(i), Message: fmt.Sprintf("poll %d", i)})
				if req.Extra != nil && req.Extra.CloseSSEStream != nil {
					req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: time.Duration(in.RetryMs) * time.Millisecond})
				}
				select {
				case <-time.After(time.Duration(in.DelayMs) * time.Millisecond):
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
			return Text("polled"), nil, nil
		})
}

// addGoSDKState adds the o.State features to a generation's server.
func (p *Server) addGoSDKState(srv *mcp.Server, genCtx context.Context) {
	srv.AddResource(&mcp.Resource{URI: ResourceURI, Name: "resource", MIMEType: "text/plain"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{
				{URI: req.Params.URI, MIMEType: "text/plain", Text: "resource"},
			}}, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "log", Description: "logs text at level through the session"},
		func(ctx context.Context, req *mcp.CallToolRequest, in peerLogIn) (*mcp.CallToolResult, any, error) {
			p.countTool("log")
			err := req.Session.Log(ctx, &mcp.LoggingMessageParams{
				Level: mcp.LoggingLevel(in.Level), Logger: "peer", Data: in.Text,
			})
			if err != nil {
				return nil, nil, err
			}
			return Text("logged"), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "sample", Description: "returns what the client samples for prompt"},
		func(ctx context.Context, req *mcp.CallToolRequest, in peerSampleIn) (*mcp.CallToolResult, any, error) {
			p.countTool("sample")
			// An answer that never comes must not outlive the generation:
			// closing a go-sdk session waits for its running handlers.
			ctx, cancel := context.WithTimeout(ctx, Timeout)
			defer cancel()
			stop := context.AfterFunc(genCtx, cancel)
			defer stop()
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{
				MaxTokens: 16,
				Messages:  []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: in.Prompt}}},
			})
			if err != nil {
				return nil, nil, err
			}
			tc, ok := res.Content.(*mcp.TextContent)
			if !ok {
				return nil, nil, fmt.Errorf("sampled %T, want text", res.Content)
			}
			return Text(tc.Text), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "ask", Description: "asks for a name, a greeting and the roots, then a colour"}, p.peerAsk)
	mcp.AddTool(srv, &mcp.Tool{Name: "ask_aside", Description: "asks for a name on the session's GET stream"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ NoIn) (*mcp.CallToolResult, any, error) {
			// The call's answer stream begins (the Go SDK sends its head
			// with the first event; the TypeScript SDK's at once)...
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: "aside", Progress: 1}); err != nil {
				return nil, nil, err
			}
			// ...then a context not of the call's request: the SDK sends the
			// elicitation on the standalone (GET) stream, as the TypeScript
			// SDK's elicitInput does.
			aside, cancel := context.WithTimeout(context.Background(), Timeout)
			defer cancel()
			defer context.AfterFunc(genCtx, cancel)()
			res, err := req.Session.Elicit(aside, &mcp.ElicitParams{Message: "name?", RequestedSchema: peerSchema("name")})
			if err != nil {
				return nil, nil, err
			}
			p.countTool("ask_aside")
			name, _ := res.Content["name"].(string)
			return Text("hello " + name), nil, nil
		})
	// What the SDK asks a client on a handler's behalf (ask's input
	// requests) must not outlive the generation either.
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			ctx, cancel := context.WithTimeout(ctx, Timeout)
			defer cancel()
			defer context.AfterFunc(genCtx, cancel)()
			return next(ctx, method, req)
		}
	})
}

// SetNextTools changes the tool list of every go-sdk generation started
// from now on (Restart, Stop/Start, a crash): each name in add becomes one
// more tool that answers like echo, each name in drop is removed. The
// running generation keeps its tools.
func (p *Server) SetNextTools(add, drop []string) {
	p.toolMu.Lock()
	p.addTools, p.dropTools = slices.Clone(add), slices.Clone(drop)
	p.toolMu.Unlock()
}

// applyNextTools applies SetNextTools to a new generation's server, before
// it has sessions (so no list_changed is sent).
func (p *Server) applyNextTools(srv *mcp.Server) {
	p.toolMu.Lock()
	add, drop := p.addTools, p.dropTools
	p.toolMu.Unlock()
	for _, name := range add {
		mcp.AddTool(srv, &mcp.Tool{Name: name, Description: "returns text"},
			func(_ context.Context, _ *mcp.CallToolRequest, in EchoIn) (*mcp.CallToolResult, any, error) {
				p.countTool(name)
				return Text(in.Text), nil, nil
			})
	}
	if len(drop) > 0 {
		srv.RemoveTools(drop...)
	}
}

// sdkServer returns the running generation's go-sdk server, or nil (peer
// stopped, or not a go-sdk peer).
func (p *Server) sdkServer() *mcp.Server {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen == nil {
		return nil
	}
	return p.gen.sdk
}

// UpdateResource has the running go-sdk generation send
// notifications/resources/updated for uri to every session subscribed to
// it. The notification goes on each session's standalone GET stream and is
// lost for a session that has none open at this moment.
func (p *Server) UpdateResource(uri string) {
	if srv := p.sdkServer(); srv != nil {
		_ = srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: uri})
	}
}

// AddResource adds a resource to the running go-sdk generation, which then
// sends notifications/resources/list_changed (10 ms later) to all its
// sessions on their standalone GET streams: a notification no client
// request prompts and no session state gates.
func (p *Server) AddResource(uri string) {
	if srv := p.sdkServer(); srv != nil {
		srv.AddResource(&mcp.Resource{URI: uri, Name: uri}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, Text: uri}}}, nil
		})
	}
}

// LogAll has every session of the running go-sdk generation log text at
// level, unprompted (on its standalone GET stream); a session sends it only
// at or above its logging/setLevel.
func (p *Server) LogAll(level, text string) {
	srv := p.sdkServer()
	if srv == nil {
		return
	}
	for ss := range srv.Sessions() {
		_ = ss.Log(context.Background(), &mcp.LoggingMessageParams{
			Level: mcp.LoggingLevel(level), Logger: "peer", Data: text,
		})
	}
}

// SessionIDs returns the ids of the running go-sdk generation's sessions.
func (p *Server) SessionIDs() []string {
	srv := p.sdkServer()
	if srv == nil {
		return nil
	}
	var ids []string
	for ss := range srv.Sessions() {
		ids = append(ids, ss.ID())
	}
	return ids
}
