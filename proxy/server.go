package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	// Name labels the upstream in logs and metrics; zero means "default".
	Name string
	// Upstream is the MCP server's endpoint URL. Required.
	Upstream string
	// Headers are set on every request sent upstream (e.g. an API key the
	// operator owns); they replace an agent's header of the same name.
	Headers map[string]string
	// StreamKeepalive is how often an agent's idle GET stream gets a
	// ": keepalive" comment, so that proxies and runtimes in between do not
	// cut it (Node's 300 s request timeout); zero means 15 s.
	StreamKeepalive time.Duration
	// Keepalive pings a quiet session's upstream this often so that it
	// neither expires nor loses its connection; zero means 120 s, negative
	// disables.
	Keepalive time.Duration
	// Listen is the address the proxy serves on; zero means 127.0.0.1:8787.
	// It also names the Host values the DNS-rebinding guard accepts.
	Listen string
	// Path is where agents reach the upstream; zero means /mcp.
	Path string
	// AllowedHosts adds Host names (with or without port) accepted besides
	// the listen address and the localhost forms.
	AllowedHosts []string
	// MaxBody caps an agent request body; zero means 4 MiB. Larger → 413.
	MaxBody int
	// HealTimeout is the most a request may spend healing (re-inits,
	// backoff while the upstream is down), and how long from its start an
	// outage is waited out rather than failed fast (a redeploy); zero
	// means 25 s.
	HealTimeout time.Duration
	// ResponseTimeout bounds the wait for the head of an upstream answer;
	// zero means 5 min. A streamed answer has no limit once its head came.
	ResponseTimeout time.Duration
	// SessionTTL drops a client session idle this long; zero means 24 h.
	SessionTTL time.Duration
	// MaxSessions caps live client sessions; zero means 100 000.
	MaxSessions int
	// MaxIdleConn closes pooled upstream connections idle this long; zero
	// means 30 s.
	MaxIdleConn time.Duration
	// ReplayTools names tools that are safe to run twice although the
	// upstream does not annotate them readOnlyHint or idempotentHint.
	ReplayTools []string

	// Credentials, when set, is the upstream credential the proxy owns: it is
	// set on every upstream request instead of the agent's Authorization, and
	// a 401 makes the proxy fetch a new token and retry once.
	Credentials upstream.Credentials
	// Breaker tunes the upstream's circuit breaker; zero fields take
	// upstream.BreakerConfig's defaults (5 failures over at least 5 s,
	// cooldown 1 s doubling to 60 s). OnChange is ignored: the proxy logs.
	Breaker upstream.BreakerConfig
	// AuthTokens, when set, are the bearer tokens agents must present
	// (Authorization: Bearer …) to use this upstream; others get 401. The
	// agent's Authorization is then the proxy's and is not forwarded. Zero
	// means no inbound auth, which is allowed only on a loopback listener
	// unless InsecureListen is set.
	AuthTokens []string
	// InsecureListen allows a non-loopback listener without AuthTokens.
	InsecureListen bool
	// MaxStreams caps concurrent GET streams per session; zero means 1. An
	// agent opening one more replaces its oldest (it has abandoned it; most
	// servers allow one GET per session and answer 409 to a second).
	MaxStreams int
	// MaxSessionsPerCredential caps live sessions created under one
	// credential (or none); zero means 1000. Beyond it initialize gets 429.
	MaxSessionsPerCredential int
	// ReadTimeout bounds reading one request, headers and body, so that a
	// slow client cannot pin a connection (slowloris); zero means 30 s.
	ReadTimeout time.Duration
	// MaxHeaderBytes caps the request head; zero means 16 KiB. Beyond it the
	// agent gets 431.
	MaxHeaderBytes int
	// MaxJSONDepth is the deepest nesting of arrays and objects an agent's
	// JSON body may have; zero means 64. Deeper → 400.
	MaxJSONDepth int
	// MaxInitBody caps an agent's initialize body; zero means 64 KiB.
	// Larger → 413.
	MaxInitBody int
	// MaxAnswer caps an upstream answer mcpheal reads whole (a JSON body, or
	// an SSE answer mcpheal reads itself rather than relays); zero means
	// 32 MiB.
	MaxAnswer int
	// MaxSSELine caps the longest SSE line mcpheal holds whole while
	// relaying; zero means 8 MiB.
	MaxSSELine int
	// SessionKeys is the key ring that seals agent session ids, written
	// "id:base64-secret[,id:base64-secret...]" (the first seals, the others
	// only open; see session/seal). Every replica and every restart given
	// the same ring can heal any session from its id alone. Zero means a
	// key made up at start: ids then open only in this process.
	SessionKeys string
	// SessionMaxAge is how long a sealed session id stays valid, however
	// active the session; zero means 7 days.
	SessionMaxAge time.Duration
	// Shared, when not nil, is the session state shared by a fleet of
	// mcpheal processes (session/redisstore; docs/deployment.md "Replicas"). Nil: this
	// process alone (sealed ids still let it restore every session).
	Shared session.Shared
	// StoreTimeout bounds each call to Shared; past it the process carries
	// on alone. Zero means 250 ms.
	StoreTimeout time.Duration
	// EraBridge says which agents are bridged across protocol eras (docs/eras.md
	// "Across protocol eras"). "auto" (the default): both directions:
	// session-era agents of an upstream that speaks only MCP 2026-07-28 go
	// through the bridge, and 2026-07-28 agents of an upstream of the
	// session era only get a session held for them. "legacy-agents" or
	// "2026-agents": only that direction. "off": neither; every request
	// passes through. "prefer-2026": auto, and session-era agents of an
	// upstream of both eras go through the bridge too.
	EraBridge string
	// MemoryBudget caps the bytes of session state and buffered answers the
	// upstream's sessions may hold (see budget); zero means 512 MiB.
	MemoryBudget int
	// ResumeBuffer caps what mcpheal keeps of one streamed answer so that
	// its agent can resume it (answerlog.go); zero means 4 MiB, negative
	// keeps nothing (the agent's Last-Event-ID then goes to the upstream,
	// rewritten). It is counted in MemoryBudget.
	ResumeBuffer int
	// ResumeWindow is how long a call whose agent's connection dropped
	// goes on for the agent to resume it, and how long its finished
	// answer is kept for that; zero means 30 s, negative keeps no answers
	// (as a negative ResumeBuffer does).
	ResumeWindow time.Duration
	// MaxJournal caps the state mcpheal keeps per session to restore after
	// a heal (the last log level's params and the subscribed URIs); zero
	// means 64 KiB. A request that would pass it gets -32019 and is not
	// sent.
	MaxJournal int
	// WriteTimeout bounds a single write to an agent: one that takes longer
	// (a slow or stalled reader) ends that agent's connection; zero means
	// 30 s. It is per write, not per response, so long SSE streams live on.
	WriteTimeout time.Duration
	// Tracer, when not nil, receives a span for every agent request and
	// what mcpheal did for it (docs/observability.md "Traces"; proxy/telemetry builds one
	// from the OTEL_* environment). Nil: tracing is off and costs nothing.
	Tracer trace.TracerProvider
	// AdminListen is the operations listener's address: /metrics, /readyz
	// (with which upstream is down and why) and /healthz. Zero means
	// AdminFor(Listen): the agent listener's host at its port + 1
	// (127.0.0.1:8788 for the default listen); "off" disables it. It
	// belongs to the process, not the upstream: a Router takes it from its
	// upstreams, which must agree.
	AdminListen string
}

// adminOff is the AdminListen value that disables the operations listener.
const adminOff = "off"

// AdminFor returns the admin listener's address for an agent listener that
// sets none: the next port, so that two mcpheal processes started with
// different --listen addresses each get their own (8787 → 8788), on
// loopback: the same host when the agent listener is on loopback, else
// 127.0.0.1, since the admin endpoints have no auth (docs/security.md "Security") and
// an agent listener on 0.0.0.0 (a container's) must not take them along.
// An ephemeral agent port (0) gets an ephemeral one.
func AdminFor(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if !IsLoopback(listen) {
		host = "127.0.0.1"
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p >= 65535 {
		p = -1
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1))
}

func (c *Config) normalize() error {
	if c.Upstream == "" {
		return errors.New("no upstream URL")
	}
	c.Name = orStr(c.Name, "default")
	c.Listen = orStr(c.Listen, "127.0.0.1:8787")
	c.Path = orStr(c.Path, "/mcp")
	if !strings.HasPrefix(c.Path, "/") {
		return fmt.Errorf("path %q must start with /", c.Path)
	}
	c.MaxBody = orInt(c.MaxBody, 4<<20)
	c.MaxStreams = orInt(c.MaxStreams, 1)
	c.MaxSessionsPerCredential = orInt(c.MaxSessionsPerCredential, 1000)
	c.ReadTimeout = orDur(c.ReadTimeout, 30*time.Second)
	c.MaxHeaderBytes = orInt(c.MaxHeaderBytes, 16<<10)
	c.MaxJSONDepth = orInt(c.MaxJSONDepth, 64)
	c.MaxInitBody = orInt(c.MaxInitBody, 64<<10)
	c.MaxAnswer = orInt(c.MaxAnswer, 32<<20)
	c.MaxSSELine = orInt(c.MaxSSELine, 8<<20)
	c.MemoryBudget = orInt(c.MemoryBudget, 512<<20)
	c.MaxJournal = orInt(c.MaxJournal, 64<<10)
	c.normalizeResume()
	c.SessionMaxAge = orDur(c.SessionMaxAge, 7*24*time.Hour)
	c.StoreTimeout = orDur(c.StoreTimeout, 250*time.Millisecond)
	switch c.EraBridge {
	case "":
		c.EraBridge = "auto"
	case "auto", "off", eraBridgeLegacy, eraBridge2026, eraBridgePrefer2026:
	default:
		return fmt.Errorf("era_bridge: want auto, legacy-agents, 2026-agents, prefer-2026 or off, got %q", c.EraBridge)
	}
	c.WriteTimeout = orDur(c.WriteTimeout, 30*time.Second)
	c.AdminListen = orStr(c.AdminListen, AdminFor(c.Listen))
	if c.AdminListen != adminOff {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			return fmt.Errorf("admin listen %q: want host:port or %q", c.AdminListen, adminOff)
		}
	}
	if len(c.AuthTokens) == 0 && !c.InsecureListen && !IsLoopback(c.Listen) {
		return fmt.Errorf("listening on %s without inbound auth: set auth tokens, or allow it explicitly (insecure listen)", c.Listen)
	}
	for _, t := range c.AuthTokens {
		if len(t) < 16 {
			return errors.New("an inbound auth token is shorter than 16 characters")
		}
	}
	c.HealTimeout = orDur(c.HealTimeout, 25*time.Second)
	c.ResponseTimeout = orDur(c.ResponseTimeout, 5*time.Minute)
	c.StreamKeepalive = orDur(c.StreamKeepalive, 15*time.Second)
	if c.Keepalive == 0 {
		c.Keepalive = 120 * time.Second
	}
	return nil
}

// normalizeResume sets the answer log's defaults (answerlog.go): a
// negative ResumeBuffer or ResumeWindow keeps nothing.
func (c *Config) normalizeResume() {
	if c.ResumeBuffer == 0 {
		c.ResumeBuffer = 4 << 20
	}
	if c.ResumeWindow == 0 {
		c.ResumeWindow = 30 * time.Second
	}
	if c.ResumeWindow < 0 {
		c.ResumeBuffer = -1
	}
}

// Server is the mcpheal proxy for one upstream. It serves agents through
// the one pipeline (pipeline.go), whose stages each have their own type:
// guard (guard.go), sessions and fleet (sessions.go, fleet.go), the
// upstream link (link.go), the healer (heal.go), the bridge (bridge.go).
type Server struct {
	cfg         Config
	log         zerolog.Logger
	count       counters
	mem         budget // Config.MemoryBudget
	replayTools map[string]bool

	guard    *guard
	trace    *tracing // nil: tracing off
	link     *link
	sessions *sessions
	healer   *healer
	eras     *eraState
	bridge   *bridge
	held     *held
	kit      *routeKit // what the bridge, the held route and agent streams use of the Server
	streams  streamSet
	answers  answerLogs // answers agents may resume (answerlog.go)
	// prm is the path of the upstream's protected resource metadata its
	// last challenge named (oauth.go); nil: the RFC 9728 default.
	prm      atomic.Pointer[string]
	inflight atomic.Int64 // ServeMCP calls running

	srvOnce sync.Once
	srv     *fasthttp.Server // only when served alone (Serve)

	bg       bgGroup       // background work: DELETEs, keepalive, pumps
	done     chan struct{} // closed by Close: stops backoff waits and keepalive
	doneOnce sync.Once

	readyMu  sync.Mutex // protects readyAt, readyErr
	readyAt  time.Time
	readyErr error
}

// routeKit is what a route that translates between eras (held.go,
// bridge.go) and an agent's open stream (getstream.go, agentstream.go) use
// of the Server: the stages every route shares, named one by one, and the
// pipeline's attempt, through which they send. They hold it, not the
// Server.
type routeKit struct {
	cfg      *Config
	log      *zerolog.Logger
	count    *counters
	mem      *budget
	bg       *bgGroup
	done     <-chan struct{}
	link     *link
	sessions *sessions
	healer   *healer
	eras     *eraState
	streams  *streamSet
	trace    *tracing
	// attempt takes an attempt of the pipeline for r (newAttempt); ctx may
	// be nil.
	attempt func(ctx *fasthttp.RequestCtx, r *request) *attempt
	// passChallenge gives the agent the upstream's 401 or 403 challenge,
	// naming mcpheal's protected resource metadata (oauth.go).
	passChallenge func(ctx *fasthttp.RequestCtx, h *fasthttp.ResponseHeader)
	// ownChallenge is a challenge naming mcpheal's metadata (oauth.go).
	ownChallenge func(h *fasthttp.RequestHeader, challenge []byte) []byte
}

// routeKit names the stages a translating route uses.
func (s *Server) routeKit() *routeKit {
	return &routeKit{cfg: &s.cfg, log: &s.log, count: &s.count, mem: &s.mem, bg: &s.bg, done: s.done,
		link: s.link, sessions: s.sessions, healer: s.healer, eras: s.eras, streams: &s.streams, trace: s.trace,
		attempt:       func(ctx *fasthttp.RequestCtx, r *request) *attempt { return newAttempt(s, ctx, r) },
		passChallenge: s.passChallenge, ownChallenge: s.ownChallenge}
}

// New returns a Server for cfg. It does not listen yet.
func New(cfg Config, log zerolog.Logger) (*Server, error) {
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	ring, err := newRing(cfg.SessionKeys)
	if err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	s := &Server{cfg: cfg, log: log, replayTools: make(map[string]bool), done: make(chan struct{})}
	for _, t := range cfg.ReplayTools {
		s.replayTools[t] = true
	}
	s.mem.limit = int64(cfg.MemoryBudget)
	s.count.init(cfg.Name)
	if s.link, err = newLink(&s.cfg, &s.log, &s.count, &s.bg, s.done); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	host, port, _ := net.SplitHostPort(s.link.up.Host())
	s.trace = newTracing(&s.cfg, host, port)
	s.link.trace = s.trace
	s.sessions = &sessions{cfg: &s.cfg, log: &s.log, count: &s.count, mem: &s.mem, link: s.link, ring: ring,
		dead: session.NewTombstones(cfg.SessionMaxAge), fleet: s.newFleet(), onRelease: s.released}
	s.sessions.store, err = session.NewStore(session.StoreConfig{
		MaxSessions:      cfg.MaxSessions,
		MaxPerCredential: cfg.MaxSessionsPerCredential,
		IdleTTL:          cfg.SessionTTL,
		MaxAge:           cfg.SessionMaxAge,
	}, s.sessions.dropped)
	if err != nil {
		s.link.up.Close()
		return nil, fmt.Errorf("session store: %w", err)
	}
	s.guard = &guard{cfg: &s.cfg, hosts: newHostGuard(cfg.Listen, cfg.AllowedHosts), mem: &s.mem, link: s.link, sessions: s.sessions}
	s.healer = &healer{cfg: &s.cfg, log: &s.log, count: &s.count, mem: &s.mem, link: s.link, sessions: s.sessions,
		streams: &s.streams, bg: &s.bg, trace: s.trace}
	s.eras = &eraState{cfg: &s.cfg, log: &s.log, link: s.link, mem: &s.mem, bg: &s.bg}
	s.link.onRecover = s.eras.recheck
	s.kit = s.routeKit()
	s.bridge = &bridge{s: s.kit}
	s.held = &held{s: s.kit, scope: heldScope(s.cfg.Listen), byKey: make(map[heldKey]*heldEntry),
		hubs: make(map[*session.Session]*heldHub)}
	s.guard.eras, s.guard.held = s.eras, s.held
	if f := s.sessions.fleet; f != nil && f.watcher != nil && s.bg.Add(1) {
		go func() {
			defer s.bg.Done()
			f.watch(s.done, s.fleetEvent)
		}()
	}
	if cfg.Keepalive > 0 && s.bg.Add(1) {
		go s.healer.keepaliveLoop(s.done)
	}
	return s, nil
}

// newFleet returns the fleet of Config.Shared, or nil.
func (s *Server) newFleet() *fleet {
	if s.cfg.Shared == nil {
		return nil
	}
	f := &fleet{cfg: &s.cfg, log: &s.log, shared: s.cfg.Shared, sleep: s.link.sleep}
	f.stats.init(s.cfg.Name)
	if w, ok := s.cfg.Shared.(session.Watcher); ok {
		f.watcher = w
		f.instance = rand.Text() // random per process
	}
	return f
}

// listenerLimits are the listener-side caps, shared by the upstreams of one
// listener (the strictest wins).
type listenerLimits struct {
	maxBody, maxHeader int
	readTimeout        time.Duration
}

func (l *listenerLimits) add(c *Config) {
	l.maxBody = max(l.maxBody, c.MaxBody)
	if l.maxHeader == 0 || c.MaxHeaderBytes < l.maxHeader {
		l.maxHeader = c.MaxHeaderBytes
	}
	if l.readTimeout == 0 || c.ReadTimeout < l.readTimeout {
		l.readTimeout = c.ReadTimeout
	}
}

// newFastHTTPServer is the listener side shared by Server and Router.
func newFastHTTPServer(h fasthttp.RequestHandler, log zerolog.Logger, l listenerLimits) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:               h,
		ErrorHandler:          serveError(l.maxBody),
		Name:                  "mcpheal",
		MaxRequestBodySize:    l.maxBody,
		ReadBufferSize:        l.maxHeader,
		ReadTimeout:           l.readTimeout, // the whole request: a slow client is cut off
		IdleTimeout:           2 * time.Minute,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
		ConnState:             trackConnState, // the listener's idle set (listener.go)
		// fasthttp quotes the request head (Authorization included) in its
		// errors unless told not to; fasthttpLogger strips what remains.
		SecureErrorLogMessage: true,
		Logger:                fasthttpLogger{log},
		// No WriteTimeout: fasthttp's bounds a whole response and would cut
		// long SSE streams. Config.WriteTimeout bounds each write instead.
	}
}

// Defaults returns the values the zero fields of a Config take, so that
// flags and config files can show them without restating them (the
// session store's and upstream client's own defaults aside).
func Defaults() Config {
	c := Config{Upstream: "http://127.0.0.1/mcp"}
	_ = c.normalize() // a valid loopback config: no error
	c.Upstream = ""
	return c
}

// IsLoopback reports whether a listen address only takes local connections
// (localhost, or a loopback IP).
func IsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Serve answers agents on ln until Shutdown, serving this one upstream at
// Config.Path and /healthz. (Router serves several.)
func (s *Server) Serve(ln net.Listener) error {
	s.srvOnce.Do(func() {
		var l listenerLimits
		l.add(&s.cfg)
		s.srv = newFastHTTPServer(s.Handler, s.log, l)
	})
	var errs, shed atomic.Uint64 // a Router counts them for /metrics
	return s.srv.Serve(newPatientListener(ln, &s.log, &errs, &shed))
}

// ListenAndServe listens on Config.Listen and serves.
func (s *Server) ListenAndServe() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return s.Serve(ln)
}

// Shutdown stops accepting, waits for in-flight requests until ctx ends,
// then releases everything. It is safe to call more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.srvOnce.Do(func() {}) // a Serve racing with Shutdown gets no server
	s.streams.stopAll()     // held-open GET streams would stall the drain
	s.bridge.stopListens()
	s.held.stopListens()
	if s.srv != nil {
		err = s.srv.ShutdownWithContext(ctx)
	}
	s.closeSessions(ctx)
	return err
}

// Close stops background work and releases the upstream pool without waiting
// for requests. It is idempotent.
func (s *Server) Close() {
	s.doneOnce.Do(func() {
		close(s.done)
		s.streams.stopAll()
		s.bridge.stopListens()
		s.sessions.store.Close()
		s.link.up.Close() // cuts exchanges in flight, so background work ends at once
		s.bg.Wait()
	})
}

// breakerOpen is breakerState's value while requests fail fast.
const breakerOpen = int(upstream.Open)

// breakerState is 0 closed, 1 half-open, 2 open.
func (s *Server) breakerState() int { return int(s.link.breaker.State()) }

// Handler is the fasthttp handler: the MCP endpoint and /healthz.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	defer s.recoverPanic(ctx, nil)
	switch string(ctx.Path()) {
	case s.cfg.Path:
		s.ServeMCP(ctx)
	case "/healthz":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	default:
		ctx.Error(notFoundText(map[string]Config{s.cfg.Name: s.cfg}), fasthttp.StatusNotFound)
	}
}

// recoverPanic turns a bug into a 502 for this request only (fasthttp does
// not recover handler panics).
func (s *Server) recoverPanic(ctx *fasthttp.RequestCtx, r *request) {
	if p := recover(); p != nil {
		s.count.panics.Add(1)
		s.log.Error().Interface("panic", p).Msg("handler panicked")
		var m message
		if r != nil {
			m = r.msg // known once the guard parsed the message
		}
		writeFailure(ctx, &m, failure{status: fasthttp.StatusBadGateway, code: codeProxyError, msg: "mcpheal internal error"})
	}
}

// serveError answers what fasthttp rejects before the handler runs.
func serveError(maxBody int) func(*fasthttp.RequestCtx, error) {
	return func(ctx *fasthttp.RequestCtx, err error) {
		if errors.Is(err, fasthttp.ErrBodyTooLarge) {
			tooLarge(ctx, maxBody)
			return
		}
		var small *fasthttp.ErrSmallBuffer
		if errors.As(err, &small) {
			writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, codeInvalidRequest, "null",
				"Request header fields too large")
			return
		}
		var te interface{ Timeout() bool }
		if errors.As(err, &te) && te.Timeout() {
			// read_timeout passed before a whole request came, often on a
			// connection a client dialed and has not used yet. 408 is the
			// status for it (RFC 9110 §15.5.9), and clients take a 408 on an
			// unused connection as the server closing it (Go's net/http
			// drops it without a word); a 400 "malformed" there was logged
			// by Go clients as an unsolicited response.
			writeError(ctx, fasthttp.StatusRequestTimeout, codeInvalidRequest, "null",
				"Request Timeout: no whole request within read_timeout")
			return
		}
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null", "Bad Request: malformed HTTP request")
	}
}

// fasthttpLogger routes fasthttp's own messages (malformed requests,
// oversized bodies: client mistakes) to debug level. It never prints what
// the client sent: errors keep only their text before the first quoted
// part, addresses and numbers pass, any other argument is redacted.
type fasthttpLogger struct{ log zerolog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	safe := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case error:
			safe[i] = safeError(v)
		case net.Addr, int, int64, uint64, float64, time.Duration:
			safe[i] = v
		default:
			safe[i] = "[redacted]"
		}
	}
	l.log.Debug().Msgf(format, safe...)
}

// safeError is err's message up to the first quoted part or buffer dump:
// fasthttp quotes offending request bytes (a header line, the request
// line, the URI) there.
func safeError(err error) string {
	msg := err.Error()
	for _, cut := range []string{`"`, "contents", "\r", "\n"} {
		if i := strings.Index(msg, cut); i >= 0 {
			msg = msg[:i]
		}
	}
	return strings.TrimRight(msg, " :,=")
}

func orInt(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

func orDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// armWrite bounds the next write to the agent by Config.WriteTimeout: an
// agent that stops reading its answer (or never started) loses its
// connection instead of pinning the answer in memory. Streams re-arm before
// each write; fasthttp writes a buffered answer right after the handler.
func (s *Server) armWrite(c net.Conn) { armWrite(c, s.cfg.WriteTimeout) }

// armWrite bounds the next writes to c by d.
func armWrite(c net.Conn, d time.Duration) {
	if c == nil {
		return
	}
	// A RequestCtx made by Init (tests, fasthttp.TimeoutHandler) has a
	// stand-in connection whose methods panic.
	defer func() { _ = recover() }()
	_ = c.SetWriteDeadline(time.Now().Add(d))
}

// maxMetadata caps an OAuth metadata document mcpheal forwards: they are a
// few KiB, and a larger one is held, with its rewritten copy, until the
// agent has read it.
const maxMetadata = 64 << 10

// wellKnown forwards OAuth discovery (RFC 9728 protected resource metadata,
// RFC 8414 authorization server metadata) to the upstream's origin, so that
// an agent whose credential passes through can find where to get one. It
// is a route like the MCP endpoint's: the guard's Host and Origin check
// first (its document names mcpheal's URL as the agent reached it), and
// the document, at most maxMetadata, is counted in the memory budget
// while it is read and until the agent has it. An upstream whose
// credential is mcpheal's (its own, or inbound auth's) has nothing for an
// agent to log in to: 404.
func (s *Server) wellKnown(ctx *fasthttp.RequestCtx, path string) {
	defer s.recoverPanic(ctx, nil)
	switch {
	case !s.guard.hosts.allow(ctx):
		writeError(ctx, fasthttp.StatusForbidden, codeForbidden, "null", "Forbidden: Host or Origin not allowed")
		return
	case s.link.ownsAuthorization():
		ctx.Error("not found: mcpheal holds this upstream's credential; there is nothing to log in to\n", fasthttp.StatusNotFound)
		return
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	resp.SetBudget(&s.mem)
	resp.SetMaxBody(maxMetadata)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set("Accept", "application/json")
	isPRM := strings.HasPrefix(path, prmPath)
	if p := s.prm.Load(); p != nil && path == prmPath+s.link.up.Path() {
		path = *p // the server named another location in its challenge
	}
	var tl *upstream.TooLargeError
	switch err := s.link.up.DoPath(req, resp, path, time.Now().Add(10*time.Second)); {
	case errors.As(err, &tl):
		writeError(ctx, fasthttp.StatusBadGateway, codeTooLarge, "null", "the upstream's OAuth metadata is larger than "+
			strconv.Itoa(maxMetadata)+" bytes")
		return
	case errors.Is(err, upstream.ErrOverBudget):
		writeError(ctx, fasthttp.StatusServiceUnavailable, codeBudget, "null", "mcpheal's memory_budget is reached; retry later")
		ctx.Response.Header.Set("Retry-After", "1")
		return
	case err != nil:
		writeError(ctx, fasthttp.StatusBadGateway, codeUpstreamDown, "null", "upstream unreachable: "+s.link.up.Origin())
		return
	}
	if resp.IsStream() {
		ctx.SetStatusCode(fasthttp.StatusBadGateway)
		return
	}
	body := resp.Body()
	if isPRM && resp.StatusCode() == fasthttp.StatusOK {
		body = s.ownMetadata(&ctx.Request.Header, body) // mcpheal is the resource the agent reached (oauth.go)
	}
	if !s.mem.take(int64(len(body))) {
		writeError(ctx, fasthttp.StatusServiceUnavailable, codeBudget, "null", "mcpheal's memory_budget is reached; retry later")
		ctx.Response.Header.Set("Retry-After", "1")
		return
	}
	ctx.SetStatusCode(resp.StatusCode())
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	// A copy, counted until the agent has read it: resp goes back now.
	b := append([]byte(nil), body...)
	ctx.Response.SetBodyStream(&budgetBody{b: b, mem: &s.mem, n: int64(len(b))}, len(b))
}
