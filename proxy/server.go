package proxy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	// Upstream is the MCP server's endpoint URL. Required.
	Upstream string
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
	// backoff while the upstream is down); zero means 15 s.
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
}

func (c *Config) normalize() error {
	if c.Upstream == "" {
		return errors.New("no upstream URL")
	}
	c.Listen = orStr(c.Listen, "127.0.0.1:8787")
	c.Path = orStr(c.Path, "/mcp")
	if !strings.HasPrefix(c.Path, "/") {
		return fmt.Errorf("path %q must start with /", c.Path)
	}
	c.MaxBody = orInt(c.MaxBody, 4<<20)
	c.HealTimeout = orDur(c.HealTimeout, 15*time.Second)
	c.ResponseTimeout = orDur(c.ResponseTimeout, 5*time.Minute)
	return nil
}

// Server is the mcpheal proxy for one upstream.
type Server struct {
	cfg         Config
	log         zerolog.Logger
	up          *upstream.Client
	store       *session.Store
	guard       hostGuard
	fpKey       []byte // keys credential fingerprints; random per process
	replayTools map[string]bool
	srv         *fasthttp.Server
	count       counters
	streams     streamSet

	bg       sync.WaitGroup // best-effort background DELETEs
	done     chan struct{}  // closed by Close: stops backoff waits
	doneOnce sync.Once
}

// New returns a Server for cfg. It does not listen yet.
func New(cfg Config, log zerolog.Logger) (*Server, error) {
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	up, err := upstream.New(upstream.Config{URL: cfg.Upstream, MaxIdleConn: cfg.MaxIdleConn})
	if err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	s := &Server{
		cfg:         cfg,
		log:         log,
		up:          up,
		guard:       newHostGuard(cfg.Listen, cfg.AllowedHosts),
		fpKey:       make([]byte, 32),
		replayTools: make(map[string]bool),
		done:        make(chan struct{}),
	}
	_, _ = rand.Read(s.fpKey)
	for _, t := range cfg.ReplayTools {
		s.replayTools[t] = true
	}
	s.store, err = session.NewStore(session.StoreConfig{
		MaxSessions: cfg.MaxSessions,
		IdleTTL:     cfg.SessionTTL,
	}, s.sessionDropped)
	if err != nil {
		return nil, fmt.Errorf("session store: %w", err)
	}
	s.srv = &fasthttp.Server{
		Handler:                       s.Handler,
		ErrorHandler:                  s.serveError,
		Name:                          "mcpheal",
		MaxRequestBodySize:            cfg.MaxBody,
		ReadTimeout:                   30 * time.Second,
		IdleTimeout:                   2 * time.Minute,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		Logger:                        fasthttpLogger{log},
	}
	return s, nil
}

// Serve answers agents on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

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
	err := s.srv.ShutdownWithContext(ctx)
	s.Close()
	return err
}

// Close stops background work and releases the upstream pool without waiting
// for requests. It is idempotent.
func (s *Server) Close() {
	s.doneOnce.Do(func() {
		close(s.done)
		s.store.Close()
		s.bg.Wait()
		s.up.Close()
	})
}

// Handler is the fasthttp handler: the MCP endpoint and /healthz.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	defer s.recoverPanic(ctx)
	s.count.requests.Add(1)
	switch string(ctx.Path()) {
	case s.cfg.Path:
		s.serveMCP(ctx)
	case "/healthz":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	default:
		ctx.Error("not found\n", fasthttp.StatusNotFound)
	}
}

// recoverPanic turns a bug into a 502 for this request only (fasthttp does
// not recover handler panics).
func (s *Server) recoverPanic(ctx *fasthttp.RequestCtx) {
	if p := recover(); p != nil {
		s.count.panics.Add(1)
		s.log.Error().Interface("panic", p).Msg("handler panicked")
		writeError(ctx, fasthttp.StatusBadGateway, codeProxyError, requestID(ctx.PostBody()), "mcpheal internal error")
	}
}

// serveError answers what fasthttp rejects before the handler runs.
func (s *Server) serveError(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, codeInvalidRequest, "null",
			fmt.Sprintf("Request body too large (limit %d bytes)", s.cfg.MaxBody))
		return
	}
	writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null", "Bad Request: malformed HTTP request")
}

// fingerprint keys the agent's credential so that a session can be bound to
// it without storing it.
func (s *Server) fingerprint(auth []byte) string {
	if len(auth) == 0 {
		return ""
	}
	m := hmac.New(sha256.New, s.fpKey)
	m.Write(auth)
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// fasthttpLogger routes fasthttp's own messages (malformed requests,
// oversized bodies: client mistakes) to debug level.
type fasthttpLogger struct{ log zerolog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug().Msgf(format, args...)
}

func orStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
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
