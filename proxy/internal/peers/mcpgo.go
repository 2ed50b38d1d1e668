package peers

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpgoserver "github.com/mark3labs/mcp-go/server"
)

// ---------------------------------------------------------------------------
// mcp-go peer

// StartMCPGo starts a mark3labs/mcp-go v1.2.1 server with an echo {text}
// tool. stateful installs a session manager equivalent to
// server.WithStateful(true) (unknown ids: 404 text/plain "Invalid session
// ID") that ExpireSessions can reset, and advertises only the session-era
// protocol versions, so that a client's server/discover probe falls back to
// initialize and real sessions exist. !stateful is the mcp-go default: any
// well-formed id is accepted (expiry is invisible) and 2026-07-28 clients go
// sessionless.
func StartMCPGo(t testing.TB, stateful bool) *Server {
	t.Helper()
	return newPeer(t, "mcp-go", func(p *Server, _ context.Context) *peerGen {
		s := mcpgoserver.NewMCPServer("peer-mcp-go", "1.0.0", mcpgoserver.WithToolCapabilities(false))
		s.AddTool(mcpgo.NewTool("echo", mcpgo.WithDescription("returns text"), mcpgo.WithString("text", mcpgo.Required())),
			func(_ context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
				p.countTool("echo")
				return mcpgo.NewToolResultText(req.GetString("text", "")), nil
			})
		opts := []mcpgoserver.StreamableHTTPOption{
			mcpgoserver.WithStreamableHTTPLogger(slog.New(slog.DiscardHandler)),
		}
		mgr := &peerMCPGoSessions{}
		mgr.reset()
		if stateful {
			opts = append(opts,
				mcpgoserver.WithSessionIdManager(mgr),
				mcpgoserver.WithStreamableHTTPProtocolVersions(
					mcpgo.ProtocolVersion20251125, mcpgo.ProtocolVersion20250618, mcpgo.ProtocolVersion20250326))
		}
		h := mcpgoserver.NewStreamableHTTPServer(s, opts...)
		expire := func() {
			if stateful {
				mgr.reset()
			}
		}
		closeGen := func() {
			ctx, cancel := context.WithTimeout(context.Background(), Timeout)
			defer cancel()
			_ = h.Shutdown(ctx)
		}
		return &peerGen{handler: h, expire: expire, close: closeGen}
	})
}

// peerMCPGoSessions is mcp-go's InsecureStatefulSessionIdManager (what
// WithStateful(true) installs) behind a resettable pointer.
type peerMCPGoSessions struct {
	mu    sync.Mutex // protects inner
	inner *mcpgoserver.InsecureStatefulSessionIdManager
}

func (m *peerMCPGoSessions) reset() {
	m.mu.Lock()
	m.inner = &mcpgoserver.InsecureStatefulSessionIdManager{}
	m.mu.Unlock()
}

func (m *peerMCPGoSessions) get() *mcpgoserver.InsecureStatefulSessionIdManager {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inner
}

func (m *peerMCPGoSessions) Generate() string { return m.get().Generate() }

func (m *peerMCPGoSessions) Validate(id string) (bool, error) { return m.get().Validate(id) }

func (m *peerMCPGoSessions) Terminate(id string) (bool, error) { return m.get().Terminate(id) }
