package proxy

import (
	"net"
	"net/url"
	"strings"

	"github.com/valyala/fasthttp"
)

// hostGuard implements the DNS-rebinding check that MCP 2025-06-18+
// §Security Warning asks of Streamable HTTP servers. Because mcpheal rewrites
// Host for the upstream, the upstream's own check no longer protects it, so
// the proxy takes it over: Host must name the proxy itself, and a browser's
// Origin must be one of those names too.
type hostGuard struct {
	hosts map[string]bool // lower-case host names, without port
}

func newHostGuard(listen string, extra []string) hostGuard {
	g := hostGuard{hosts: make(map[string]bool)}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	names := []string{"localhost", "127.0.0.1", "::1"}
	if host != "" && host != "0.0.0.0" && host != "::" {
		names = append(names, host)
	}
	names = append(names, extra...)
	for _, n := range names {
		g.hosts[strings.ToLower(hostname(n))] = true
	}
	return g
}

// hostname strips an optional port and IPv6 brackets from a Host value.
// The port is not checked: a container or port forward may publish the
// proxy under another port, and DNS rebinding is about names.
func hostname(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.Trim(h, "[]")
}

// allowHost reports whether a Host header names this proxy.
func (g hostGuard) allowHost(h []byte) bool {
	if len(h) == 0 {
		return false
	}
	name := hostname(b2s(h))
	return g.hosts[name] || g.hosts[strings.ToLower(name)]
}

// allowOrigin reports whether an Origin header is absent (a non-browser
// client), or a page served from one of the proxy's own names.
func (g hostGuard) allowOrigin(o []byte) bool {
	if len(o) == 0 {
		return true
	}
	u, err := url.Parse(string(o))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return g.hosts[strings.ToLower(u.Hostname())]
}

func (g hostGuard) allow(ctx *fasthttp.RequestCtx) bool {
	return g.allowHost(ctx.Request.Header.Host()) && g.allowOrigin(ctx.Request.Header.PeekBytes(hdrOrigin))
}
