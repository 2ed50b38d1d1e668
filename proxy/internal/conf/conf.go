package conf

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

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

// AdminOff is the AdminListen value that disables the operations listener.
const AdminOff = "off"

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

func (c *Config) Normalize() error {
	if c.Upstream == "" {
		return errors.New("no upstream URL")
	}
	c.Name = OrStr(c.Name, "default")
	c.Listen = OrStr(c.Listen, "127.0.0.1:8787")
	c.Path = OrStr(c.Path, "/mcp")
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
	case "auto", "off", EraBridgeLegacy, EraBridge2026, EraBridgePrefer2026:
	default:
		return fmt.Errorf("era_bridge: want auto, legacy-agents, 2026-agents, prefer-2026 or off, got %q", c.EraBridge)
	}
	c.WriteTimeout = orDur(c.WriteTimeout, 30*time.Second)
	c.AdminListen = OrStr(c.AdminListen, AdminFor(c.Listen))
	if c.AdminListen != AdminOff {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			return fmt.Errorf("admin listen %q: want host:port or %q", c.AdminListen, AdminOff)
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

// Defaults returns the values the zero fields of a Config take, so that
// flags and config files can show them without restating them (the
// session store's and upstream client's own defaults aside).
func Defaults() Config {
	c := Config{Upstream: "http://127.0.0.1/mcp"}
	_ = c.Normalize() // a valid loopback config: no error
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

// OrStr returns s, or def when s is empty.
func OrStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// The era_bridge settings besides auto (both directions) and off.
const (
	EraBridgeLegacy = "legacy-agents" // session-era agents of 2026-07-28-only upstreams only
	EraBridge2026   = "2026-agents"   // 2026-07-28 agents of session-era upstreams only
	// eraBridgePrefer2026 is auto, and session-era agents of an upstream of
	// both eras go through the bridge too: the upstream sees 2026-07-28
	// traffic only (docs/eras.md "Servers of both eras").
	EraBridgePrefer2026 = "prefer-2026"
)
