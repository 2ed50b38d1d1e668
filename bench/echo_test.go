package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy"
)

// startProxy serves mcpheal in front of upstream on a loopback port.
func startProxy(t testing.TB, upstream string) string {
	t.Helper()
	return startProxyWith(t, upstream, nil)
}

// startProxyWith is startProxy with mod applied to the config.
func startProxyWith(t testing.TB, upstream string, mod func(*proxy.Config)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxy.Config{Upstream: upstream, Listen: ln.Addr().String()}
	if mod != nil {
		mod(&cfg)
	}
	p, err := proxy.New(cfg, zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
		<-done
	})
	return "http://" + ln.Addr().String() + "/mcp"
}

// TestEchoThroughProxy runs the harness's session, call and expiry steps
// against both upstream variants, directly and through mcpheal, so that
// CI proves the benchmark measures real echoes and that an expired session
// heals with one initialize.
func TestEchoThroughProxy(t *testing.T) {
	t.Parallel()
	for _, variant := range []struct {
		name string
		json bool
	}{{"json", true}, {"sse", false}} {
		t.Run(variant.name, func(t *testing.T) {
			t.Parallel()
			echo := NewEcho(variant.json)
			up := httptest.NewServer(echo.Handler)
			t.Cleanup(up.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			hc := &http.Client{Timeout: 10 * time.Second}
			for _, url := range []string{up.URL, startProxy(t, up.URL)} {
				s, err := Initialize(ctx, hc, url, true)
				if err != nil {
					t.Fatalf("Initialize(%s) = %v", url, err)
				}
				for id := uint64(1); id <= 3; id++ {
					if err := s.Call(ctx, hc, id); err != nil {
						t.Fatalf("Call(%s, %d) = %v", url, id, err)
					}
				}
			}
			// Through the proxy, an expired upstream session heals once.
			s, err := Initialize(ctx, hc, startProxy(t, up.URL), true)
			if err != nil {
				t.Fatal(err)
			}
			before := echo.Initializes()
			if n := echo.ExpireAll(); n < 1 {
				t.Fatalf("ExpireAll() = %d, want ≥ 1", n)
			}
			for id := uint64(10); id <= 12; id++ {
				if err := s.Call(ctx, hc, id); err != nil {
					t.Fatalf("Call after expiry (%d) = %v", id, err)
				}
			}
			if got := echo.Initializes() - before; got != 1 {
				t.Errorf("initializes after expiry = %d, want 1", got)
			}
		})
	}
}
