package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// deadUpstream is an MCP endpoint URL on which nothing listens, and its
// address.
func deadUpstream(t *testing.T) (url, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/mcp", addr
}

// opsGet GETs url with the Host, Origin and Authorization given (each when
// not empty).
func opsGet(t *testing.T, url, host, origin, auth string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestOpsEndpointsOffAgentListener: the agent listener, which other hosts
// may reach and which requires inbound auth here, serves neither /metrics
// nor /readyz, to a DNS-rebinding page (Host: evil.example) or anyone else,
// and its /healthz answers "ok" without a word about the upstreams, even
// while one is down.
func TestOpsEndpointsOffAgentListener(t *testing.T) {
	t.Parallel()
	down, downAddr := deadUpstream(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const token = "ops-inbound-token-0123456789"
	r, err := NewRouter(ln.Addr().String(), []conf.Config{
		{Name: "secret-upstream-name", Upstream: down, Path: "/mcp", AuthTokens: []string{token}},
	}, nopLog())
	if err != nil {
		t.Fatal(err)
	}
	go r.Serve(ln)
	t.Cleanup(func() { r.Shutdown(context.Background()) })
	base := "http://" + ln.Addr().String()
	leaks := []string{"secret-upstream-name", downAddr, "refused", "mcpheal_", "not ready"}
	for _, path := range []string{"/metrics", "/readyz"} {
		for _, c := range []struct{ name, host, auth string }{
			{"foreign Host", "evil.example", ""},
			{"no token", "", ""},
			{"with token", "", "Bearer " + token},
		} {
			code, body := opsGet(t, base+path, c.host, "", c.auth)
			if code != http.StatusNotFound {
				t.Errorf("agent listener %s, %s: %d, want 404", path, c.name, code)
			}
			for _, l := range leaks {
				if strings.Contains(body, l) {
					t.Errorf("agent listener %s, %s: body reveals %q: %.300q", path, c.name, l, body)
				}
			}
		}
	}
	if code, body := opsGet(t, base+"/healthz", "evil.example", "", ""); code != 200 || body != "ok\n" {
		t.Errorf("agent listener /healthz: %d %q, want 200 \"ok\\n\" and nothing else", code, body)
	}
}

// TestAdminListener: the admin listener serves /metrics, /readyz with the
// details (which upstream is down, and why) and /healthz; it refuses DNS
// rebinding (a foreign Host name or Origin) but takes IP addresses and
// allowed names, as Prometheus and the kubelet send; it serves nothing else.
func TestAdminListener(t *testing.T) {
	t.Parallel()
	down, downAddr := deadUpstream(t)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, _, admin, _ := startRouterAdmin(t, []conf.Config{
		{Name: "alive", Upstream: up.URL(), Path: "/a/mcp", AllowedHosts: []string{"mcpheal.internal"}},
		{Name: "down", Upstream: down, Path: "/d/mcp", AuthTokens: []string{"admin-test-token-0123456789"}},
	})
	port := admin[strings.LastIndex(admin, ":")+1:]
	code, body := opsGet(t, admin+"/readyz", "", "", "")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "down: ") || !strings.Contains(body, downAddr) ||
		strings.Contains(body, "alive") {
		t.Errorf("admin /readyz: %d %q; want 503 naming down, its address and the error", code, body)
	}
	if code, body := opsGet(t, admin+"/metrics", "", "", ""); code != 200 || !strings.Contains(body, `mcpheal_sessions{upstream="down"}`) {
		t.Errorf("admin /metrics: %d %.300q", code, body)
	}
	cases := []struct {
		name, path, host, origin string
		want                     int
	}{
		{"healthz", "/healthz", "", "", 200},
		{"localhost", "/metrics", "localhost:" + port, "", 200},
		{"IP address", "/metrics", "10.1.2.3:" + port, "", 200},
		{"IPv6 address", "/metrics", "[fd00::1]:" + port, "", 200},
		{"allowed name", "/metrics", "mcpheal.internal:" + port, "", 200},
		{"own origin", "/metrics", "", "http://127.0.0.1:" + port, 200},
		{"foreign name", "/metrics", "evil.example:" + port, "", 403},
		{"foreign name, readyz", "/readyz", "evil.example", "", 403},
		{"foreign origin", "/metrics", "", "http://evil.example", 403},
		{"MCP path", "/a/mcp", "", "", 404},
	}
	for _, c := range cases {
		code, body := opsGet(t, admin+c.path, c.host, c.origin, "")
		if code != c.want {
			t.Errorf("%s: %d %.200q, want %d", c.name, code, body, c.want)
		}
		if c.want == 403 && (strings.Contains(body, "down") || strings.Contains(body, "mcpheal_")) {
			t.Errorf("%s: refusal reveals %q", c.name, body)
		}
	}
	resp, err := peers.RawClient.Post(admin+"/metrics", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d, want 405", resp.StatusCode)
	}
}

// TestAdminListenConfig: the admin address defaults to loopback, "off"
// disables it, it must be host:port and not the agent address, the
// upstreams of one router must agree on it, and a reload cannot move it.
func TestAdminListenConfig(t *testing.T) {
	t.Parallel()
	const u = "http://127.0.0.1:1/mcp"
	cases := []struct {
		name   string
		ups    []conf.Config
		want   string // AdminAddr
		errHas string
	}{
		{"default", []conf.Config{{Name: "a", Upstream: u, Path: "/a"}}, "127.0.0.1:8788", ""},
		{"off", []conf.Config{{Name: "a", Upstream: u, Path: "/a", AdminListen: "off"}}, "", ""},
		{"set on one", []conf.Config{{Name: "a", Upstream: u, Path: "/a"}, {Name: "b", Upstream: u, Path: "/b", AdminListen: "127.0.0.1:9999"}},
			"127.0.0.1:9999", ""},
		{"disagree", []conf.Config{{Name: "a", Upstream: u, Path: "/a", AdminListen: "127.0.0.1:9998"},
			{Name: "b", Upstream: u, Path: "/b", AdminListen: "127.0.0.1:9999"}}, "", "disagree"},
		{"not host:port", []conf.Config{{Name: "a", Upstream: u, Path: "/a", AdminListen: "8788"}}, "", "want host:port"},
		{"agent address", []conf.Config{{Name: "a", Upstream: u, Path: "/a", AdminListen: "127.0.0.1:8787"}}, "", "agent listen"},
	}
	for _, c := range cases {
		r, err := NewRouter("127.0.0.1:8787", c.ups, nopLog())
		if c.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("%s: err %v, want one containing %q", c.name, err, c.errHas)
			}
			if r != nil {
				r.Shutdown(context.Background())
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := r.AdminAddr(); got != c.want {
			t.Errorf("%s: AdminAddr() = %q, want %q", c.name, got, c.want)
		}
		if err := r.Reload([]conf.Config{{Name: "a", Upstream: u, Path: "/a", AdminListen: "127.0.0.1:7777"}}); err != nil {
			t.Errorf("%s: reload: %v", c.name, err)
		} else if got := r.AdminAddr(); got != c.want {
			t.Errorf("%s: after a reload AdminAddr() = %q, want %q (a listener cannot move)", c.name, got, c.want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r.Shutdown(ctx)
		cancel()
	}
}

// TestFasthttpLoggerRedacts: whatever fasthttp hands its logger, what the
// client sent is never printed: errors are cut where fasthttp starts
// quoting (%q) request bytes or dumps its buffer, and arguments other than
// errors, addresses and numbers are redacted.
func TestFasthttpLoggerRedacts(t *testing.T) {
	t.Parallel()
	logs := &testLog{t: t}
	l := fasthttpLogger{zeroLog(logs)}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8787}
	l.Printf("error when serving connection %q<->%q: %v", addr, addr,
		fmt.Errorf("error when reading request headers: malformed mime header: missing colon: %q: buffer size=99, contents: %q",
			"Authorization Bearer LOGGER-SECRET-1", "POST / HTTP/1.1\r\nCookie: LOGGER-SECRET-2\r\n"))
	l.Printf("error: %v", fmt.Errorf("invalid request uri %q", "/mcp?token=LOGGER-SECRET-3"))
	l.Printf("error: %v", errors.New("error when reading request headers: x. Buffer size=9, contents: LOGGER-SECRET-6\r\n"))
	l.Printf("%.3f %s - %s", 1.5, "#0001 - GET http://h/mcp?token=LOGGER-SECRET-4", "LOGGER-SECRET-5")
	out := logs.String()
	if strings.Contains(out, "LOGGER-SECRET") {
		t.Errorf("fasthttp's log line kept a secret:\n%s", out)
	}
	for _, want := range []string{"127.0.0.1:8787", "missing colon", "invalid request uri", "Buffer size=9"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q, which is safe and useful:\n%s", want, out)
		}
	}
}
