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

	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

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
	env      *env         // what the exchange, the routes and agents' streams use of the stages
	streams  *streamRoute // agents' GET streams
	answers  answerLogs   // answers agents may resume (answerlog.go)
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

// New returns a Server for cfg. It does not listen yet.
func New(cfg Config, log zerolog.Logger) (*Server, error) {
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	ring, err := newRing(cfg.SessionKeys)
	if err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	s := &Server{cfg: cfg, log: log, replayTools: make(map[string]bool), done: make(chan struct{}), streams: &streamRoute{}}
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
		streams: &s.streams.set, bg: &s.bg, trace: s.trace}
	s.eras = &eraState{cfg: &s.cfg, log: &s.log, link: s.link, mem: &s.mem, bg: &s.bg}
	s.link.onRecover = s.eras.recheck
	s.env = &env{cfg: &s.cfg, log: &s.log, count: &s.count, mem: &s.mem, bg: &s.bg, done: s.done,
		link: s.link, sessions: s.sessions, healer: s.healer, eras: s.eras, trace: s.trace,
		answers: &s.answers, replayTools: s.replayTools, challenges: &challenges{link: s.link, path: s.cfg.Path}}
	s.streams.env = s.env
	s.bridge = &bridge{s: s.env}
	s.held = &held{s: s.env, streams: &s.streams.set, scope: heldScope(s.cfg.Listen), byKey: make(map[heldKey]*heldEntry),
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
	s.streams.set.stopAll() // held-open GET streams would stall the drain
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
		s.streams.set.stopAll()
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

// armWrite bounds the next write to the agent by Config.WriteTimeout: an
// agent that stops reading its answer (or never started) loses its
// connection instead of pinning the answer in memory. Streams re-arm before
// each write; fasthttp writes a buffered answer right after the handler.
func (s *Server) armWrite(c net.Conn) { armWrite(c, s.cfg.WriteTimeout) }
