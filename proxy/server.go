package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/route/bridge"
	"github.com/mcpheal/mcpheal/proxy/internal/route/held"
	"github.com/mcpheal/mcpheal/proxy/internal/route/stream"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// Server is the mcpheal proxy for one upstream. It serves agents through
// the one pipeline (pipeline.go), whose stages each have their own type:
// guard (guard.go), sessions and fleet (sessions.go, fleet.go), the
// upstream link (link.go), the healer (heal.go), the bridge (bridge.go).
type Server struct {
	cfg         conf.Config
	log         zerolog.Logger
	count       obs.Counters
	mem         wire.Budget // Config.MemoryBudget
	replayTools map[string]bool

	guard      *guard
	trace      *obs.Tracing // nil: tracing off
	link       *link.Link
	sessions   *heal.Sessions
	healer     *heal.Healer
	eras       *era.State
	bridge     *bridge.Route
	held       *held.Route
	env        *exchange.Env        // the exchange's ground and stages; routes start their attempts with it
	challenges *exchange.Challenges // the upstream's OAuth challenges (wellknown.go)
	streams    *stream.Route        // agents' GET streams
	answers    exchange.AnswerLogs  // answers agents may resume (answerlog.go)
	inflight   atomic.Int64         // ServeMCP calls running

	srvOnce sync.Once
	srv     *fasthttp.Server // only when served alone (Serve)
	lns     listeners        // what Serve was given (listener.go)

	bg       wire.BgGroup  // background work: DELETEs, keepalive, pumps
	done     chan struct{} // closed by Close: stops backoff waits and keepalive
	doneOnce sync.Once

	readyMu  sync.Mutex // protects readyAt, readyErr
	readyAt  time.Time
	readyErr error
}

// New returns a Server for cfg. It does not listen yet.
func New(cfg conf.Config, log zerolog.Logger) (*Server, error) {
	if err := cfg.Normalize(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	ring, err := heal.NewRing(cfg.SessionKeys)
	if err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	s := &Server{cfg: cfg, log: log, replayTools: make(map[string]bool), done: make(chan struct{}), streams: &stream.Route{}}
	for _, t := range cfg.ReplayTools {
		s.replayTools[t] = true
	}
	s.mem.Limit = int64(cfg.MemoryBudget)
	s.count.Init(cfg.Name)
	if s.link, err = link.NewLink(&s.cfg, &s.log, &s.count, &s.bg, s.done); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	host, port, _ := net.SplitHostPort(s.link.Up.Host())
	s.trace = obs.NewTracing(&s.cfg, host, port)
	s.link.Trace = s.trace
	s.sessions = &heal.Sessions{Cfg: &s.cfg, Log: &s.log, Count: &s.count, Mem: &s.mem, Link: s.link, Ring: ring,
		Dead: session.NewTombstones(cfg.SessionMaxAge), Fleet: s.newFleet(), OnRelease: s.released}
	s.sessions.Store, err = session.NewStore(session.StoreConfig{
		MaxSessions:      cfg.MaxSessions,
		MaxPerCredential: cfg.MaxSessionsPerCredential,
		IdleTTL:          cfg.SessionTTL,
		MaxAge:           cfg.SessionMaxAge,
	}, s.sessions.Dropped)
	if err != nil {
		s.link.Up.Close()
		return nil, fmt.Errorf("session store: %w", err)
	}
	s.guard = &guard{cfg: &s.cfg, hosts: NewHostGuard(cfg.Listen, cfg.AllowedHosts), mem: &s.mem, link: s.link, sessions: s.sessions}
	s.healer = &heal.Healer{Cfg: &s.cfg, Log: &s.log, Count: &s.count, Mem: &s.mem, Link: s.link, Sessions: s.sessions,
		Streams: &s.streams.Set, Bg: &s.bg, Trace: s.trace}
	s.eras = &era.State{Cfg: &s.cfg, Log: &s.log, Link: s.link, Mem: &s.mem, Bg: &s.bg}
	s.link.OnRecover = s.eras.Recheck
	s.newRoutes()
	if f := s.sessions.Fleet; f != nil && f.Watcher != nil && s.bg.Add(1) {
		go func() {
			defer s.bg.Done()
			f.Watch(s.done, s.fleetEvent)
		}()
	}
	if cfg.Keepalive > 0 && s.bg.Add(1) {
		go s.healer.KeepaliveLoop(s.done)
	}
	return s, nil
}

// newRoutes makes the exchange and the routes over it. Each route gets
// the exchange; as its narrow sender, what it sends upstream itself (the
// link, seen through the route's Upstream); and the few stages it uses
// itself.
func (s *Server) newRoutes() {
	s.challenges = &exchange.Challenges{Link: s.link, Path: s.cfg.Path}
	s.env = exchange.NewEnv(exchange.Env{Cfg: &s.cfg, Log: &s.log, Count: &s.count, Mem: &s.mem, Bg: &s.bg, Done: s.done},
		exchange.Stages{Link: s.link, Sessions: s.sessions, Healer: s.healer, Eras: s.eras, Trace: s.trace,
			Answers: &s.answers, ReplayTools: s.replayTools, Challenges: s.challenges})
	if sh, ok := s.cfg.Shared.(session.Answers); ok && s.cfg.ResumeBuffer > 0 && s.cfg.ResumeWindow > 0 {
		s.answers.Share(sh, rand.Text()) // answers outlive their replica (docs/streams.md "Across replicas")
	}
	s.streams.Env, s.streams.Up = s.env, s.link
	s.streams.Sessions, s.streams.Healer, s.streams.Answers = s.sessions, s.healer, &s.answers
	s.bridge = &bridge.Route{S: s.env, Up: s.link, Sessions: s.sessions, Eras: s.eras, Trace: s.trace}
	s.held = &held.Route{S: s.env, Up: s.link, Sessions: s.sessions, Healer: s.healer, Eras: s.eras, Challenges: s.challenges,
		Streams: &s.streams.Set, Scope: held.Scope(s.cfg.Listen), ByKey: make(map[held.Key]*held.Entry),
		Hubs: make(map[*session.Session]*held.Hub)}
}

// newFleet returns the fleet of Config.Shared, or nil.
func (s *Server) newFleet() *heal.Fleet {
	if s.cfg.Shared == nil {
		return nil
	}
	f := &heal.Fleet{Cfg: &s.cfg, Log: &s.log, Shared: s.cfg.Shared, Sleep: s.link.Sleep}
	f.Stats.Init(s.cfg.Name)
	if w, ok := s.cfg.Shared.(session.Watcher); ok {
		f.Watcher = w
		f.Instance = rand.Text() // random per process
	}
	return f
}

// listenerLimits are the listener-side caps, shared by the upstreams of one
// listener (the strictest wins).
type listenerLimits struct {
	maxBody, maxHeader int
	readTimeout        time.Duration
}

func (l *listenerLimits) add(c *conf.Config) {
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

// Serve answers agents on ln until Shutdown, serving this one upstream at
// Config.Path and /healthz. (Router serves several.)
func (s *Server) Serve(ln net.Listener) error {
	if !s.lns.add(ln) {
		return nil // after Shutdown
	}
	s.srvOnce.Do(func() {
		var l listenerLimits
		l.add(&s.cfg)
		s.srv = newFastHTTPServer(s.Handler, s.log, l)
	})
	if s.srv == nil { // Shutdown came first
		_ = ln.Close()
		return nil
	}
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
	s.streams.Set.StopAll() // held-open GET streams would stall the drain
	s.bridge.StopListens()
	s.held.StopListens()
	if s.srv != nil {
		err = s.srv.ShutdownWithContext(ctx)
	}
	s.lns.close()
	s.closeSessions(ctx)
	return err
}

// Close stops background work and releases the upstream pool without waiting
// for requests. It is idempotent.
func (s *Server) Close() {
	s.doneOnce.Do(func() {
		close(s.done)
		s.streams.Set.StopAll()
		s.bridge.StopListens()
		s.sessions.Store.Close()
		s.link.Up.Close() // cuts exchanges in flight, so background work ends at once
		s.bg.Wait()
	})
}

// breakerOpen is breakerState's value while requests fail fast.
const breakerOpen = int(upstream.Open)

// breakerState is 0 closed, 1 half-open, 2 open.
func (s *Server) breakerState() int { return int(s.link.Breaker.State()) }

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
		ctx.Error(notFoundText(map[string]conf.Config{s.cfg.Name: s.cfg}), fasthttp.StatusNotFound)
	}
}

// recoverPanic turns a bug into a 502 for this request only (fasthttp does
// not recover handler panics).
func (s *Server) recoverPanic(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	if p := recover(); p != nil {
		s.count.Panics.Add(1)
		s.log.Error().Interface("panic", p).Msg("handler panicked")
		var m wire.Message
		if r != nil {
			m = r.Msg // known once the guard parsed the message
		}
		exchange.WriteFailure(ctx, &m, exchange.Failure{Status: fasthttp.StatusBadGateway, Code: wire.CodeProxyError, Msg: "mcpheal internal error"})
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
			wire.WriteError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, wire.CodeInvalidRequest, "null",
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
			wire.WriteError(ctx, fasthttp.StatusRequestTimeout, wire.CodeInvalidRequest, "null",
				"Request Timeout: no whole request within read_timeout")
			return
		}
		wire.WriteError(ctx, fasthttp.StatusBadRequest, wire.CodeInvalidRequest, "null", "Bad Request: malformed HTTP request")
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

// armWrite bounds the next write to the agent by Config.WriteTimeout: an
// agent that stops reading its answer (or never started) loses its
// connection instead of pinning the answer in memory. Streams re-arm before
// each write; fasthttp writes a buffered answer right after the handler.
func (s *Server) armWrite(c net.Conn) { wire.ArmWrite(c, s.cfg.WriteTimeout) }
