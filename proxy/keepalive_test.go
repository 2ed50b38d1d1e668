package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// Tests of keepalive (keepalive.go).

// TestStateKeepalive: an idle GET stream gets ": keepalive" comments every
// Config.StreamKeepalive, with headers that keep proxies in between from
// buffering it.
func TestStateKeepalive(t *testing.T) {
	t.Parallel()
	const every = 100 * time.Millisecond
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.StreamKeepalive = every })
	sid := peers.RawInitialize(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("Mcp-Session-Id", sid)
	start := time.Now()
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET = %d %q, want 200", resp.StatusCode, b)
	}
	for h, want := range map[string]string{
		"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
	} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("GET %s = %q, want %q", h, got, want)
		}
	}
	// The upstream's own lines pass through too (go-sdk opens its GET stream
	// with ": ok"); on an idle stream they are comments. The first
	// keepalive goes with the head, at once; then one every StreamKeepalive.
	const want = 3 + 1
	var keepalives int
	sc := bufio.NewScanner(resp.Body)
	for keepalives < want && sc.Scan() {
		switch l := sc.Text(); {
		case l == ": keepalive":
			keepalives++
		case l != "" && !strings.HasPrefix(l, ":"):
			t.Errorf("idle GET stream line %q, want comments only", l)
		}
	}
	el := time.Since(start)
	if keepalives < want {
		t.Fatalf("GET stream ended after %d keepalives (%v)", keepalives, sc.Err())
	}
	if el < (want-1)*every-every/2 || el > 20*every {
		t.Errorf("%d keepalives took %v, want about %v", want, el, (want-1)*every)
	}
}
