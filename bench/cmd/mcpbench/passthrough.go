package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy"
)

// passthrough is the floor under mcpheal's CPU per request: a relay on the
// same fasthttp server, with fasthttp's own HostClient, that passes each
// request upstream and each answer back and does nothing else (no session
// mapping, no classifier, no budget, no agent watch). Measured beside
// mcpheal (`-alt self -alt-env MCPBENCH_PROXY=passthrough`), the difference
// is what mcpheal's own work costs; what is left against nginx is Go's
// network runtime and fasthttp. Session ids pass through unchanged, so the
// harness's sessions are the upstream's own.
type passthrough struct {
	srv     *fasthttp.Server
	up      *fasthttp.HostClient
	host    string
	answers atomic.Uint64
}

func newPassthrough(upstream string) (*passthrough, error) {
	u, err := url.Parse(upstream)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("passthrough: upstream %q is not an http URL", upstream)
	}
	p := &passthrough{host: u.Host, up: &fasthttp.HostClient{
		Addr:                          u.Host,
		MaxConns:                      4096,
		ReadTimeout:                   30 * time.Second,
		WriteTimeout:                  30 * time.Second,
		DisableHeaderNamesNormalizing: true,
		NoDefaultUserAgentHeader:      true,
	}}
	p.srv = &fasthttp.Server{
		Handler:                       p.handle,
		Name:                          "passthrough",
		ReadTimeout:                   30 * time.Second,
		IdleTimeout:                   2 * time.Minute,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		NoDefaultDate:                 true,
		DisableHeaderNamesNormalizing: true,
		CloseOnShutdown:               true,
	}
	return p, nil
}

func (p *passthrough) handle(ctx *fasthttp.RequestCtx) {
	ctx.Request.SetHost(p.host)
	if err := p.up.Do(&ctx.Request, &ctx.Response); err != nil {
		ctx.Response.Reset()
		ctx.Error("upstream: "+err.Error(), fasthttp.StatusBadGateway)
		return
	}
	p.answers.Add(1)
}

func (p *passthrough) Serve(ln net.Listener) error { return p.srv.Serve(ln) }

func (p *passthrough) Shutdown(ctx context.Context) error { return p.srv.ShutdownWithContext(ctx) }

// Stats has only the requests answered: the relay heals nothing.
func (p *passthrough) Stats() proxy.Stats { return proxy.Stats{Requests: p.answers.Load()} }
