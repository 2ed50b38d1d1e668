package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// Router serves several upstreams on one listener, each at its own path,
// plus /healthz ("ok", nothing more). The operations endpoints /metrics and
// /readyz, which name upstreams and say why one is down, are served only on
// the admin listener (Config.AdminListen), never to agents. Reload swaps the
// set of upstreams while serving.
type Router struct {
	listen  string
	admin   string // Config.AdminListen of every upstream, or adminOff
	log     zerolog.Logger
	srv     *fasthttp.Server
	adm     *fasthttp.Server // the admin listener's
	reg     *prometheus.Registry
	metrics fasthttp.RequestHandler
	routes  atomic.Pointer[routeTable]

	mu sync.Mutex // serializes Reload and Shutdown; protects closed
	// closed is set by Shutdown; Reload then refuses.
	closed bool
	lns    listeners // what Serve and ServeAdmin were given
	// acceptErrors counts the listeners' accept errors waited out, and
	// connsShed the connections closed or refused at the connection cap
	// (listener.go).
	acceptErrors, connsShed atomic.Uint64
}

// routeTable is immutable once published.
type routeTable struct {
	byPath map[string]*Server
	// retired servers keep answering the sessions they hold after a reload
	// changed their upstream's settings (new sessions use the new server).
	retired map[string][]*Server
	configs map[string]conf.Config // by name
	// adminGuard is the admin listener's DNS-rebinding check.
	adminGuard hostGuard
	// notFound answers a path this listener does not serve.
	notFound string
}

// NewRouter builds servers for ups (each needs a distinct Name and Path)
// listening on listen, with the admin listener at their AdminListen (unset
// on all of them: the default; set on several: the same value). It listens
// on nothing yet: see Serve, ServeAdmin and ListenAndServe.
func NewRouter(listen string, ups []conf.Config, log zerolog.Logger) (*Router, error) {
	r := &Router{listen: conf.OrStr(listen, "127.0.0.1:8787"), log: log, reg: prometheus.NewRegistry()}
	for _, c := range ups {
		if c.AdminListen != "" && r.admin != "" && c.AdminListen != r.admin {
			return nil, fmt.Errorf("upstreams disagree on the admin listen address (%s, %s): there is one per process",
				r.admin, c.AdminListen)
		}
		r.admin = conf.OrStr(r.admin, c.AdminListen)
	}
	r.metrics = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}))
	r.reg.MustRegister(collector{r})
	t, err := r.build(ups, &routeTable{})
	if err != nil {
		return nil, err
	}
	for _, c := range t.configs {
		r.admin = c.AdminListen // normalized: the same in each
		break
	}
	if _, port, _ := net.SplitHostPort(r.admin); r.admin == r.listen && port != "0" {
		for _, s := range t.servers() {
			s.Close()
		}
		return nil, fmt.Errorf("admin listen %s is the agent listen address: give operations their own port", r.listen)
	}
	t.adminGuard = r.newAdminGuard(t)
	r.routes.Store(t)
	var l listenerLimits
	for _, s := range t.byPath {
		l.add(&s.cfg)
	}
	r.srv = newFastHTTPServer(r.Handler, log, l)
	r.adm = newFastHTTPServer(r.AdminHandler, log, listenerLimits{maxBody: 1 << 10, maxHeader: l.maxHeader, readTimeout: l.readTimeout})
	return r, nil
}

// build makes the table for ups, reusing the servers of old whose config is
// unchanged. It registers new servers' metrics.
func (r *Router) build(ups []conf.Config, old *routeTable) (*routeTable, error) {
	if len(ups) == 0 {
		return nil, errors.New("no upstreams configured")
	}
	t := &routeTable{byPath: map[string]*Server{}, retired: map[string][]*Server{}, configs: map[string]conf.Config{}}
	var created []*Server
	fail := func(err error) (*routeTable, error) {
		for _, s := range created {
			s.Close()
		}
		return nil, err
	}
	for _, c := range ups {
		c.Listen = r.listen
		if r.admin != "" {
			c.AdminListen = r.admin // the running one: a listener cannot move
		}
		if err := c.Normalize(); err != nil {
			return fail(err)
		}
		if _, dup := t.configs[c.Name]; dup {
			return fail(fmt.Errorf("upstream %q configured twice", c.Name))
		}
		if prev, dup := t.byPath[c.Path]; dup {
			return fail(fmt.Errorf("upstreams %q and %q share path %s", prev.cfg.Name, c.Name, c.Path))
		}
		if reserved(c.Path) {
			return fail(fmt.Errorf("upstream %q: path %s is reserved", c.Name, c.Path))
		}
		s := old.byPath[c.Path]
		if s == nil || !reflect.DeepEqual(old.configs[c.Name], c) {
			ns, err := New(c, r.log.With().Str(obs.LogUpstream, c.Name).Logger())
			if err != nil {
				return fail(err)
			}
			created = append(created, ns)
			s = ns
		}
		t.byPath[c.Path] = s
		t.configs[c.Name] = c
	}
	t.notFound = notFoundText(t.configs)
	return t, nil
}

// notFoundText is the answer to a path the listener does not serve: the
// paths it does serve, so that an agent configured with another one (a
// /<name>/mcp where mcpheal serves one upstream at /mcp) is told which. A
// listener whose upstreams check inbound tokens names none: its paths are
// for the agents that hold one.
func notFoundText(configs map[string]conf.Config) string {
	var paths []string
	for _, c := range configs {
		if len(c.AuthTokens) > 0 {
			return "not found\n"
		}
		paths = append(paths, c.Path)
	}
	sort.Strings(paths)
	return "not found: this mcpheal serves MCP at " + strings.Join(paths, ", ") + " (and /healthz)\n"
}

func reserved(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics"
}

// Reload applies a new set of upstreams: new ones appear, removed ones stop
// taking requests and are closed once their in-flight requests are done,
// changed ones serve new sessions with the new settings while the old server
// keeps its existing sessions until they end.
func (r *Router) Reload(ups []conf.Config) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("router is shut down")
	}
	old := r.routes.Load()
	t, err := r.build(ups, old)
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	keep := map[*Server]bool{}
	for _, s := range t.byPath {
		keep[s] = true
	}
	var drop []*Server
	for path, list := range old.retired {
		for _, s := range list {
			if _, served := t.byPath[path]; served && s.sessions.Store.Len() > 0 {
				t.retired[path] = append(t.retired[path], s)
			} else {
				drop = append(drop, s)
			}
		}
	}
	for path, s := range old.byPath {
		switch {
		case keep[s]:
		case t.byPath[path] != nil && t.byPath[path].cfg.Name == s.cfg.Name:
			t.retired[path] = append(t.retired[path], s) // changed: keep its sessions
		default:
			drop = append(drop, s) // removed
		}
	}
	t.adminGuard = r.newAdminGuard(t)
	r.routes.Store(t)
	for _, s := range drop {
		go s.drain(30 * time.Second)
	}
	r.log.Info().Strs("upstreams", t.names()).Int("dropped", len(drop)).Msg("configuration reloaded")
	return nil
}

func (t *routeTable) names() []string {
	var n []string
	for name := range t.configs {
		n = append(n, name)
	}
	sort.Strings(n)
	return n
}

// Handler routes an agent's request to its upstream's server. Besides the
// upstreams it serves /healthz, which says "ok" and nothing else, so that
// it needs no guard (a kubelet probe or `mcpheal healthcheck` send any
// Host); /metrics and /readyz are on the admin listener only.
func (r *Router) Handler(ctx *fasthttp.RequestCtx) {
	t := r.routes.Load()
	path := ctx.Path()
	if s := t.byPath[wire.B2s(path)]; s != nil {
		if len(t.retired) > 0 {
			s = t.owner(s, wire.B2s(path), ctx.Request.Header.PeekBytes(wire.HdrSessionID))
		}
		s.ServeMCP(ctx)
		return
	}
	if p := wire.B2s(path); strings.HasPrefix(p, "/.well-known/oauth-") {
		r.wellKnown(ctx, t, p)
		return
	}
	if string(path) == "/healthz" {
		healthy(ctx)
		return
	}
	ctx.Error(t.notFound, fasthttp.StatusNotFound)
}

func healthy(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("ok\n")
}

// AdminHandler serves the admin listener: /metrics, /readyz (naming the
// upstreams that are not ready, and why) and /healthz. It is for operators
// and their tools, on loopback by default; like the agent listener it
// refuses DNS rebinding: Host must be an IP address, localhost, the admin
// listen host or an allowed host, and a browser's Origin one of those names.
func (r *Router) AdminHandler(ctx *fasthttp.RequestCtx) {
	t := r.routes.Load()
	host := ctx.Request.Header.Host()
	hostOK := t.adminGuard.AllowHost(host) || isIPHost(host)
	if !hostOK || !t.adminGuard.AllowOrigin(ctx.Request.Header.PeekBytes(wire.HdrOrigin)) {
		ctx.Error("forbidden: Host or Origin not allowed\n", fasthttp.StatusForbidden)
		return
	}
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		ctx.Error("method not allowed\n", fasthttp.StatusMethodNotAllowed)
		return
	}
	switch string(ctx.Path()) {
	case "/healthz":
		healthy(ctx)
	case "/readyz":
		r.ready(ctx, t)
	case "/metrics":
		r.metrics(ctx)
	default:
		ctx.Error("not found\n", fasthttp.StatusNotFound)
	}
}

// newAdminGuard accepts the admin listen host, the localhost forms and
// every upstream's allowed hosts.
func (r *Router) newAdminGuard(t *routeTable) hostGuard {
	var extra []string
	for _, c := range t.configs {
		extra = append(extra, c.AllowedHosts...)
	}
	listen := r.admin
	if listen == conf.AdminOff {
		listen = ""
	}
	return NewHostGuard(listen, extra)
}

// isIPHost reports whether a Host value is an IP address (with or without
// port). DNS rebinding needs a name, so an address is safe to accept: it is
// how Prometheus and the kubelet reach a pod.
func isIPHost(h []byte) bool {
	return len(h) > 0 && net.ParseIP(hostname(wire.B2s(h))) != nil
}

// wellKnown routes OAuth discovery to the upstream whose path ends it
// (RFC 9728 §3.1 inserts the well-known segment before the resource's path):
// /.well-known/oauth-protected-resource/mcp is the upstream served at /mcp.
func (r *Router) wellKnown(ctx *fasthttp.RequestCtx, t *routeTable, p string) {
	for _, kind := range []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-authorization-server"} {
		rest, ok := strings.CutPrefix(p, kind)
		if !ok {
			continue
		}
		s, upPath := t.byPath[rest], ""
		if s != nil {
			upPath = s.link.Up.Path()
		} else if rest == "" && len(t.byPath) == 1 {
			for _, only := range t.byPath {
				s = only // the origin's own metadata: the upstream origin's
			}
		}
		if s == nil {
			break
		}
		s.wellKnown(ctx, kind+upPath)
		return
	}
	ctx.Error("not found\n", fasthttp.StatusNotFound)
}

// owner returns the retired server that holds the session, or s.
func (t *routeTable) owner(s *Server, path string, sid []byte) *Server {
	if len(sid) == 0 {
		return s
	}
	for _, old := range t.retired[path] {
		if old.sessions.Store.Has(session.ClientID(wire.B2s(sid))) {
			return old
		}
	}
	return s
}

// ready answers 200 when every upstream is reachable with its breaker
// closed, else 503 naming the ones that are not.
func (r *Router) ready(ctx *fasthttp.RequestCtx, t *routeTable) {
	var bad []string
	for _, s := range t.byPath {
		if err := s.Ready(); err != nil {
			bad = append(bad, s.cfg.Name+": "+err.Error())
		}
	}
	sort.Strings(bad)
	ctx.SetContentType("text/plain; charset=utf-8")
	if len(bad) > 0 {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("not ready\n" + strings.Join(bad, "\n") + "\n")
		return
	}
	ctx.SetBodyString("ready\n")
}

// URLs returns, per upstream name, the URL an agent should use.
func (r *Router) URLs() map[string]string {
	out := map[string]string{}
	for path, s := range r.routes.Load().byPath {
		out[s.cfg.Name] = "http://" + r.listen + path
	}
	return out
}

// ProbeUpstreams asks every upstream once, in the background, and logs one
// line each: reachable and its protocol era, or why not (start-up).
func (r *Router) ProbeUpstreams() {
	for _, s := range r.routes.Load().servers() {
		if s.bg.Add(1) {
			go func() {
				defer s.bg.Done()
				s.probeAtStart()
			}()
		}
	}
}

// Serve answers agents on ln until Shutdown; after Shutdown it closes ln
// and returns nil at once.
func (r *Router) Serve(ln net.Listener) error {
	if !r.lns.add(ln) {
		return nil
	}
	return r.srv.Serve(newPatientListener(ln, &r.log, &r.acceptErrors, &r.connsShed))
}

// ServeAdmin answers the operations endpoints on ln until Shutdown.
func (r *Router) ServeAdmin(ln net.Listener) error {
	if !r.lns.add(ln) {
		return nil
	}
	return r.adm.Serve(newPatientListener(ln, &r.log, &r.acceptErrors, &r.connsShed))
}

// AdminAddr is the admin listener's address, or "" when it is off.
func (r *Router) AdminAddr() string {
	if r.admin == conf.AdminOff {
		return ""
	}
	return r.admin
}

// ListenAndServe listens on the router's address, and on the admin address
// unless it is off, and serves both until Shutdown.
func (r *Router) ListenAndServe() error {
	ln, err := net.Listen("tcp", r.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if a := r.AdminAddr(); a != "" {
		aln, err := net.Listen("tcp", a)
		if err != nil {
			ln.Close()
			return fmt.Errorf("admin listen: %w", err)
		}
		go func() {
			if err := r.ServeAdmin(aln); err != nil {
				r.log.Error().Err(err).Msg("admin listener stopped")
			}
		}()
	}
	return r.Serve(ln)
}

// Shutdown stops accepting, lets in-flight requests finish until ctx ends,
// then DELETEs the upstream sessions (bounded) and closes every server.
func (r *Router) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	t := r.routes.Load()
	for _, s := range t.servers() {
		s.streams.Set.StopAll() // held-open GET streams would stall the drain
		s.bridge.StopListens()
		s.held.StopListens()
	}
	err := errors.Join(r.srv.ShutdownWithContext(ctx), r.adm.ShutdownWithContext(ctx))
	r.lns.close()
	var wg sync.WaitGroup
	for _, list := range append([][]*Server{t.servers()}, valuesOf(t.retired)...) {
		for _, s := range list {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.closeSessions(ctx)
			}()
		}
	}
	wg.Wait()
	return err
}

func (t *routeTable) servers() []*Server {
	var out []*Server
	for _, s := range t.byPath {
		out = append(out, s)
	}
	return out
}

func valuesOf(m map[string][]*Server) [][]*Server {
	var out [][]*Server
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
