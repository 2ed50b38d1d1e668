package doctor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestDoctorEra: a Go SDK 1.8 server restricted to MCP 2026-07-28 is
// reported as needing the bridge; the same server serving both eras is not;
// one of the session era only is reported as one mcpheal holds sessions
// of for 2026-07-28 agents.
func TestDoctorEra(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		versions []string
		bridged  bool
		held     bool
	}{
		{"2026-07-28 only", []string{"2026-07-28"}, true, false},
		{"both eras", nil, false, false},
		{"session era only", []string{"2025-11-25", "2025-06-18"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := mcp.NewServer(&mcp.Implementation{Name: "era", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: tc.versions})
			// Stateless serves 2026-07-28; a session-era-only server is
			// stateful.
			h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: !tc.held})
			hs := httptest.NewServer(h)
			defer hs.Close()
			r, err := Run(context.Background(), hs.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			_, _ = r.WriteTo(&out)
			if r.Bridged != tc.bridged || strings.Contains(out.String(), "bridges session-era agents") != tc.bridged {
				t.Fatalf("Bridged %v, want %v; report:\n%s", r.Bridged, tc.bridged, out.String())
			}
			if r.Held != tc.held || strings.Contains(out.String(), "holds a session for each 2026-07-28 agent") != tc.held {
				t.Fatalf("Held %v, want %v; report:\n%s", r.Held, tc.held, out.String())
			}
		})
	}
}
