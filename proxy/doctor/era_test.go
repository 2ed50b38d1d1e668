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
// reported as needing the bridge; the same server serving both eras is not.
func TestDoctorEra(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		versions []string
		bridged  bool
	}{
		{"2026-07-28 only", []string{"2026-07-28"}, true},
		{"both eras", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := mcp.NewServer(&mcp.Implementation{Name: "era", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: tc.versions})
			h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true})
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
		})
	}
}
