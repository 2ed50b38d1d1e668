// Command mcpheal is a sidecar proxy that keeps MCP Streamable HTTP sessions
// alive: agents point at it instead of at the MCP server, and it re-creates
// upstream sessions that died and replays the request, so the agent never
// notices.
//
//	mcpheal --upstream http://127.0.0.1:3000/mcp        # serves http://127.0.0.1:8787/mcp
//	mcpheal --config mcpheal.yaml                        # several upstreams, /<name>/mcp each
//	mcpheal --check-config mcpheal.yaml                  # validate and exit 0/1
//	mcpheal doctor URL                                   # can mcpheal heal this server?
//	mcpheal login -token-file F URL                      # log in to an OAuth server once, for every agent
//	mcpheal healthcheck [URL]                            # GET /healthz, for container HEALTHCHECKs
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/proxy/telemetry"
	"github.com/mcpheal/mcpheal/session/redisstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := cli(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// exitError carries an exit status other than the usual 2.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

// cli dispatches subcommands and maps errors to exit statuses: 0 fine, 1 a
// negative answer (bad config for --check-config, unhealable server for
// doctor, unhealthy for healthcheck), 2 anything else.
func cli(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var err error
	switch {
	case len(args) > 0 && args[0] == "doctor":
		err = runDoctor(ctx, args[1:], stdout, stderr)
	case len(args) > 0 && args[0] == "login":
		err = runLogin(ctx, args[1:], stdout, stderr)
	case len(args) > 0 && args[0] == "healthcheck":
		err = runHealthcheck(ctx, args[1:], stderr)
	default:
		err = run(ctx, args, stdout, stderr)
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "mcpheal:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 2
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// options are the command-line flags of the proxy itself.
type options struct {
	config, checkConfig string
	upstream, listen    string
	adminListen         string
	path                string
	logLevel, logFormat string
	shutdownTimeout     time.Duration
	insecureListen      bool
	s                   settings
	hosts, tools        listFlag
	tokenEnvs           listFlag
	loginFile           string
	store               storeSpec
	set                 map[string]bool // flags given on the command line
}

func newFlags(o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mcpheal", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.upstream, "upstream", "", "MCP server endpoint to heal, e.g. http://127.0.0.1:3000/mcp (required without --config)")
	fs.StringVar(&o.config, "config", "", "YAML config file with several upstreams (see config.example.yaml); SIGHUP reloads it")
	fs.StringVar(&o.checkConfig, "check-config", "", "validate this config file and exit: 0 valid, 1 not")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8787", "address to serve agents on")
	fs.StringVar(&o.adminListen, "admin-listen", "",
		"address to serve /metrics, /readyz and /healthz on, for operators only (default: the --listen port + 1 on loopback, 127.0.0.1:8788 for the default --listen); empty or off disables")
	fs.StringVar(&o.path, "path", "/mcp", "URL path agents use (with --upstream)")
	fs.DurationVar(&o.s.HealTimeout, "heal-timeout", builtin.HealTimeout, "most a request may spend healing or waiting out an outage before it gets mcpheal's error")
	fs.DurationVar(&o.s.ResponseTimeout, "response-timeout", builtin.ResponseTimeout, "wait for the head of an upstream answer")
	fs.DurationVar(&o.s.SessionTTL, "session-ttl", builtin.SessionTTL, "drop a client session idle this long")
	fs.IntVar(&o.s.MaxSessions, "max-sessions", builtin.MaxSessions, "most live client sessions")
	fs.IntVar(&o.s.MaxBody, "max-body", builtin.MaxBody, "largest agent request body in bytes (413 beyond)")
	fs.DurationVar(&o.s.MaxIdleConn, "max-idle-conn", builtin.MaxIdleConn, "close pooled upstream connections idle this long")
	fs.DurationVar(&o.s.Keepalive, "keepalive", builtin.Keepalive, "ping a quiet session's upstream this often; 0 disables")
	fs.IntVar(&o.s.MaxJSONDepth, "max-json-depth", builtin.MaxJSONDepth, "deepest nesting of an agent's JSON body (400 beyond)")
	fs.IntVar(&o.s.MaxInitBody, "max-init-body", builtin.MaxInitBody, "largest agent initialize body in bytes (413 beyond)")
	fs.IntVar(&o.s.MaxAnswer, "max-answer", builtin.MaxAnswer, "largest upstream answer in bytes that mcpheal reads whole")
	fs.IntVar(&o.s.MaxSSELine, "max-sse-line", builtin.MaxSSELine, "longest SSE line in bytes that mcpheal holds whole while relaying")
	fs.DurationVar(&o.s.SessionMaxAge, "session-max-age", builtin.SessionMaxAge, "how long a sealed session id stays valid")
	fs.IntVar(&o.s.MemoryBudget, "memory-budget", builtin.MemoryBudget, "bytes of session state and buffered answers mcpheal may hold per upstream (503 beyond)")
	fs.IntVar(&o.s.MaxJournal, "max-journal", builtin.MaxJournal, "bytes of state (log level, subscribed URIs) mcpheal keeps per session to restore after a heal (-32019 beyond)")
	fs.DurationVar(&o.s.WriteTimeout, "write-timeout", builtin.WriteTimeout, "a single write to an agent taking longer ends its connection")
	fs.StringVar(&o.s.EraBridge, "era-bridge", builtin.EraBridge, "across protocol eras, auto: bridge session-era agents to an upstream that speaks only MCP 2026-07-28, and hold sessions for 2026-07-28 agents of an upstream of the session era only; legacy-agents or 2026-agents: only that direction; prefer-2026: auto, and bridge session-era agents of an upstream of both eras too; off: neither, pass all traffic through")
	storeFlags(fs, o)
	fs.Var(&o.hosts, "allow-host", "extra Host name accepted by the DNS-rebinding guard (repeatable)")
	fs.Var(&o.tools, "replay-tool", "tool safe to run twice although not annotated so (repeatable)")
	fs.StringVar(&o.loginFile, "upstream-login", "", "`FILE` written by mcpheal login: mcpheal logs in to the upstream with it, and agents need no OAuth (docs/oauth.md)")
	fs.Var(&o.tokenEnvs, "auth-token-env", "environment variable holding a bearer token agents must present (repeatable; ≥ 16 characters)")
	fs.BoolVar(&o.insecureListen, "insecure-listen", false, "allow a non-loopback --listen address without inbound auth")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "auto", "json, console, or auto (console on a terminal)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 20*time.Second, "on SIGTERM/SIGINT, wait this long for in-flight requests")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}

const usage = `usage:
  mcpheal --upstream URL [flags]       heal one MCP server; agents use http://127.0.0.1:8787/mcp
  mcpheal --config FILE [flags]        several servers from a YAML file, /<name>/mcp each; SIGHUP reloads
  mcpheal --check-config FILE          validate a config file: exit 0, or 1 with file:line: key: problem
  mcpheal doctor [-H 'K: V']... URL    probe an MCP server: can mcpheal heal it? (exit 0 yes, 1 no;
                                       -upstream-login FILE or -config FILE: with that login, as mcpheal would)
  mcpheal login -token-file F URL      log in to an OAuth-protected server once, for every agent (docs/oauth.md)
  mcpheal healthcheck [URL]            exit 0 if the proxy's /healthz answers 200 (container HEALTHCHECK)

flags:
`

// run is the proxy: parse flags, load the config, serve until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &options{}
	fs := newFlags(o, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (subcommands: doctor, login, healthcheck)", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.checkConfig != "" {
		return checkConfig(o, stdout)
	}
	if o.config == "" && o.upstream == "" {
		fs.Usage()
		return errors.New("--upstream or --config is required")
	}
	creds := newCredCache()
	defer creds.Close()
	rc, err := resolve(o, os.LookupEnv, creds)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, rc.logLevel, rc.logFormat)
	if err != nil {
		return err
	}
	return serve(ctx, o, rc, creds, log)
}

// checkConfig is --check-config: validate the file with the flags given,
// build (without serving) what it describes, print a summary; exit 0 or 1.
func checkConfig(o *options, stdout io.Writer) error {
	o.config = o.checkConfig
	creds := newCredCache()
	defer creds.Close()
	rc, err := resolve(o, os.LookupEnv, creds)
	if err == nil {
		var r *proxy.Router
		if r, err = proxy.NewRouter(rc.listen, rc.ups, zerolog.Nop()); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = r.Shutdown(ctx)
			cancel()
		}
	}
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	admin := "off"
	if rc.admin != "off" {
		admin = orDefault(rc.admin, proxy.AdminFor(rc.listen))
	}
	fmt.Fprintf(stdout, "%s: ok, listen %s, admin %s\n", o.checkConfig, rc.listen, admin)
	for _, c := range rc.ups {
		fmt.Fprintf(stdout, "  %-12s %s → %s\n", c.Name, agentURL(rc.listen, c.Path), redact(c.Upstream))
	}
	return nil
}

// resolved is the effective configuration: file, then flags on top.
type resolved struct {
	listen              string
	admin               string // "" the default, "off" disabled
	logLevel, logFormat string
	ups                 []proxy.Config
	store               storeSpec
	shared              *redisstore.Store // the open store (serve), nil for memory
	tracing             telemetry.Config  // the file's tracing section (config_tracing.go)
	tracer              trace.TracerProvider
	// bound is the agent listener's address once listening: the port
	// --listen 127.0.0.1:0 got, which the start-up lines announce.
	bound string
}

// resolve builds the effective configuration. Without --config it is the
// single --upstream served at --path; with it, the file's upstreams, each
// flag given on the command line overriding the file for every upstream
// (--replay-tool adds to each upstream's list; --upstream and --path need a
// file with exactly one upstream).
func resolve(o *options, lookup func(string) (string, bool), creds *credCache) (*resolved, error) {
	flagS := o.s
	if flagS.Keepalive == 0 {
		flagS.Keepalive = -1 // proxy.Config: negative disables, zero means the default
	}
	tokens, err := tokensFromEnv(o.tokenEnvs, lookup)
	if err != nil {
		return nil, err
	}
	admin := o.adminListen // "": derived from the listen address (proxy.AdminFor)
	if o.set["admin-listen"] && admin == "" {
		admin = "off"
	}
	if o.config == "" {
		rc := &resolved{listen: o.listen, admin: admin, logLevel: o.logLevel, logFormat: o.logFormat, ups: []proxy.Config{{
			Name: "default", Upstream: o.upstream, Path: o.path, Listen: o.listen, AdminListen: admin,
			AllowedHosts: o.hosts, ReplayTools: o.tools, AuthTokens: tokens, InsecureListen: o.insecureListen,
			HealTimeout: flagS.HealTimeout, ResponseTimeout: flagS.ResponseTimeout, SessionTTL: flagS.SessionTTL,
			MaxSessions: flagS.MaxSessions, MaxBody: flagS.MaxBody, MaxIdleConn: flagS.MaxIdleConn,
			Keepalive: flagS.Keepalive, MaxJSONDepth: flagS.MaxJSONDepth, MaxInitBody: flagS.MaxInitBody,
			MaxAnswer: flagS.MaxAnswer, MaxSSELine: flagS.MaxSSELine, WriteTimeout: flagS.WriteTimeout, EraBridge: flagS.EraBridge,
			MemoryBudget: flagS.MemoryBudget, MaxJournal: flagS.MaxJournal, SessionMaxAge: flagS.SessionMaxAge,
			// From the environment, never a flag: the process table is public.
			SessionKeys: os.Getenv("MCPHEAL_SESSION_KEYS"),
		}}}
		if o.loginFile != "" {
			rc.ups[0].Credentials = creds.get(&credSpec{Header: "Authorization", OAuth: &oauthSpec{TokenFile: o.loginFile}})
		}
		if rc.store, err = resolveStore(o, nil, lookup); err != nil {
			return nil, err
		}
		return rc, rc.checkExposure("")
	}
	f, err := loadConfig(o.config, lookup)
	if err != nil {
		return nil, err
	}
	if (o.set["upstream"] || o.set["path"] || o.loginFile != "") && len(f.Upstreams) != 1 {
		return nil, fmt.Errorf("--upstream, --path and --upstream-login need a config file with exactly one upstream; %s has %d", o.config, len(f.Upstreams))
	}
	rc := &resolved{listen: f.Listen, admin: f.AdminListen, logLevel: orDefault(f.LogLevel, "info"), logFormat: orDefault(f.LogFormat, "auto"),
		tracing: f.Tracing}
	over := func(name string, dst *string, v string) {
		if o.set[name] {
			*dst = v
		}
	}
	over("listen", &rc.listen, o.listen)
	over("admin-listen", &rc.admin, admin)
	over("log-level", &rc.logLevel, o.logLevel)
	over("log-format", &rc.logFormat, o.logFormat)
	for _, c := range f.proxyConfigs(creds.get) {
		c.Listen, c.AdminListen = rc.listen, rc.admin
		over("upstream", &c.Upstream, o.upstream)
		over("path", &c.Path, o.path)
		overrideSettings(&c, o.set, flagS)
		if o.set["allow-host"] {
			c.AllowedHosts = append([]string(nil), o.hosts...)
		}
		if o.set["auth-token-env"] {
			c.AuthTokens = tokens
		}
		if o.loginFile != "" {
			c.Credentials = creds.get(&credSpec{Header: "Authorization", OAuth: &oauthSpec{TokenFile: o.loginFile}})
		}
		if o.set["insecure-listen"] {
			c.InsecureListen = o.insecureListen
		}
		c.ReplayTools = append(c.ReplayTools, o.tools...)
		rc.ups = append(rc.ups, c)
	}
	if rc.store, err = resolveStore(o, f, lookup); err != nil {
		return nil, err
	}
	return rc, rc.checkExposure(o.config)
}

// tokensFromEnv reads --auth-token-env variables.
func tokensFromEnv(names []string, lookup func(string) (string, bool)) ([]string, error) {
	var out []string
	for _, n := range names {
		t, ok := lookup(n)
		switch {
		case !ok:
			return nil, fmt.Errorf("--auth-token-env %s: the variable is not set", n)
		case len(t) < 16:
			return nil, fmt.Errorf("--auth-token-env %s: a token must be at least 16 characters, it has %d", n, len(t))
		}
		out = append(out, t)
	}
	return out, nil
}

// checkExposure refuses a listener other hosts can reach while an upstream
// has no inbound auth (docs/security.md "Security": inbound auth), naming every way out. The proxy checks
// it too; this says it in the operator's terms.
func (rc *resolved) checkExposure(file string) error {
	if proxy.IsLoopback(rc.listen) {
		return nil
	}
	for _, c := range rc.ups {
		if len(c.AuthTokens) == 0 && !c.InsecureListen {
			where := "--auth-token-env NAME"
			if file != "" {
				where = "auth_tokens in " + file + " or --auth-token-env NAME"
			}
			return fmt.Errorf("listen %s is reachable from other hosts and upstream %q has no inbound auth: "+
				"set %s (agents then send Authorization: Bearer <token>), or accept the exposure with --insecure-listen",
				rc.listen, c.Name, where)
		}
	}
	return nil
}

// overrideSettings applies the settings flags given on the command line.
func overrideSettings(c *proxy.Config, set map[string]bool, s settings) {
	durs := map[string]struct {
		dst *time.Duration
		v   time.Duration
	}{
		"heal-timeout":     {&c.HealTimeout, s.HealTimeout},
		"response-timeout": {&c.ResponseTimeout, s.ResponseTimeout},
		"session-ttl":      {&c.SessionTTL, s.SessionTTL},
		"max-idle-conn":    {&c.MaxIdleConn, s.MaxIdleConn},
		"keepalive":        {&c.Keepalive, s.Keepalive},
		"write-timeout":    {&c.WriteTimeout, s.WriteTimeout},
		"session-max-age":  {&c.SessionMaxAge, s.SessionMaxAge},
	}
	for name, d := range durs {
		if set[name] {
			*d.dst = d.v
		}
	}
	ints := map[string]struct {
		dst *int
		v   int
	}{
		"max-sessions":   {&c.MaxSessions, s.MaxSessions},
		"max-body":       {&c.MaxBody, s.MaxBody},
		"max-json-depth": {&c.MaxJSONDepth, s.MaxJSONDepth},
		"max-init-body":  {&c.MaxInitBody, s.MaxInitBody},
		"max-answer":     {&c.MaxAnswer, s.MaxAnswer},
		"max-sse-line":   {&c.MaxSSELine, s.MaxSSELine},
		"memory-budget":  {&c.MemoryBudget, s.MemoryBudget},
		"max-journal":    {&c.MaxJournal, s.MaxJournal},
	}
	for name, n := range ints {
		if set[name] {
			*n.dst = n.v
		}
	}
	if set["era-bridge"] {
		c.EraBridge = s.EraBridge
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// serve runs the router until ctx ends, reloading the config file on
// SIGHUP, then shuts down gracefully.
func serve(ctx context.Context, o *options, rc *resolved, creds *credCache, log zerolog.Logger) error {
	shared, err := openStore(rc.store, rc.ups)
	if err != nil {
		return fmt.Errorf("session store: %w", err)
	}
	if shared != nil {
		defer shared.Close()
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if perr := shared.Ping(pctx); perr != nil {
			// Not fatal: sessions still heal, each process alone, until it answers.
			log.Warn().Err(perr).Str("store", rc.store.String()).Msg("session store does not answer yet")
		}
		cancel()
	}
	rc.shared = shared
	stopTracing, err := startTracing(ctx, rc, log)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer stopTracing()
	r, err := proxy.NewRouter(rc.listen, rc.ups, log)
	if err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	lns, err := listen(rc.listen, r.AdminAddr(), rc.admin != "", log)
	if err != nil {
		_ = r.Shutdown(context.Background())
		return err
	}
	errc := make(chan error, len(lns))
	go func() { errc <- r.Serve(lns[0]) }()
	if len(lns) > 1 {
		go func() { errc <- r.ServeAdmin(lns[1]) }()
	}
	// stop ends both listeners (Shutdown closes them, also under a Serve
	// that had not taken its listener yet) and waits for their Serves.
	stop := func(ctx context.Context, first error) error {
		err := r.Shutdown(ctx)
		for range len(lns) - btoi(first != nil) {
			<-errc
		}
		return errors.Join(first, err)
	}
	setMemoryLimit(rc.ups, log)
	rc.bound = lns[0].Addr().String()
	admin := ""
	if len(lns) > 1 {
		admin = lns[1].Addr().String()
	}
	announce(log, rc, admin)
	r.ProbeUpstreams()
	graceful := func() error {
		log.Info().Dur("timeout", o.shutdownTimeout).Msg("shutting down: finishing in-flight requests")
		sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
		defer cancel()
		err := stop(sctx, nil)
		log.Info().Msg("stopped")
		return err
	}
	for {
		select {
		case err := <-errc:
			return stop(context.Background(), fmt.Errorf("serve: %w", orClosed(err)))
		case <-hup:
			if o.config == "" {
				// No file to reload: a SIGHUP is the terminal that started
				// mcpheal going away (README "Quick start"), and mcpheal
				// ends with it, as for SIGTERM, instead of living on
				// detached and holding its ports.
				log.Info().Msg("SIGHUP and no --config file to reload: shutting down")
				return graceful()
			}
			reload(o, rc, r, creds, log)
		case <-ctx.Done():
			return graceful()
		}
	}
}

// listen opens the agent listener and, unless admin is "", the admin one.
// An admin address the operator set must be free; the one derived from the
// listen address (explicit false) may be taken, by another mcpheal whose
// agent port it is or anything else: the admin endpoints then go to a free
// port of the same host, which the start-up line names, and mcpheal serves.
func listen(agents, admin string, explicit bool, log zerolog.Logger) ([]net.Listener, error) {
	ln, err := net.Listen("tcp", agents)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if admin == "" {
		return []net.Listener{ln}, nil
	}
	aln, err := net.Listen("tcp", admin)
	if err != nil && !explicit {
		host, _, _ := net.SplitHostPort(admin)
		if aln, err = net.Listen("tcp", net.JoinHostPort(host, "0")); err == nil {
			log.Warn().Str("taken", admin).Str("admin", aln.Addr().String()).
				Msg("the admin address derived from --listen (its port + 1) is taken: /metrics and /readyz are served on a free port instead; set --admin-listen to choose one")
		}
	}
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("admin listen (--admin-listen, admin_listen; off disables it): %w", err)
	}
	return []net.Listener{ln, aln}, nil
}

// orClosed names a listener that stopped without saying why.
func orClosed(err error) error {
	if err == nil {
		return errors.New("a listener stopped")
	}
	return err
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reload re-reads the config file. A bad file is logged and the running
// configuration keeps serving.
func reload(o *options, cur *resolved, r *proxy.Router, creds *credCache, log zerolog.Logger) {
	next, err := resolve(o, os.LookupEnv, creds)
	if err == nil && next.admin != cur.admin {
		log.Warn().Str("admin_listen", cur.admin).Str("file", next.admin).Msg("an admin listen change applies at restart only")
		next.admin = cur.admin
		for i := range next.ups {
			next.ups[i].AdminListen = cur.admin
		}
	}
	if err == nil && next.listen != cur.listen {
		log.Warn().Str("listen", cur.listen).Str("file", next.listen).Msg("a listen change applies at restart only")
		next.listen = cur.listen // a running listener cannot move
		for i := range next.ups {
			next.ups[i].Listen = cur.listen
		}
	}
	if err == nil {
		if next.store != cur.store {
			log.Warn().Str("session_store", cur.store.String()).Msg("a session store change applies at restart only")
		}
		next.store, next.shared = cur.store, cur.shared
		attachStore(cur.shared, next.ups, cur.store.Timeout)
		if !sameTracing(next.tracing, cur.tracing) {
			log.Warn().Msg("a tracing change applies at restart only")
		}
		next.tracing, next.tracer = cur.tracing, cur.tracer
		setTracer(next.ups, cur.tracer)
		err = r.Reload(next.ups)
	}
	if err != nil {
		log.Error().Err(err).Str("config", o.config).Msg("config reload rejected; the previous configuration keeps serving")
		return
	}
	if next.logLevel != cur.logLevel || next.logFormat != cur.logFormat {
		log.Warn().Msg("log settings apply at restart only")
	}
	cur.ups = next.ups
	setMemoryLimit(cur.ups, log)
	announceUpstreams(log, cur)
}

// memoryHeadroom is what the process may hold beyond its upstreams' memory
// budgets before the Go runtime's memory limit presses: code, goroutine
// stacks, connection buffers, SSE read buffers and held lines, and freed
// memory not yet collected.
const memoryHeadroom = 256 << 20

// setMemoryLimit sets the Go runtime's soft memory limit to the sum of the
// upstreams' memory_budget plus memoryHeadroom, unless GOMEMLIMIT is set
// (the operator's value, or "off", wins). Without a limit Go collects only
// when the heap doubles and returns freed memory to the OS over minutes;
// near the limit it collects and returns memory at once, so a burst of
// large answers does not leave the process holding twice the budget.
func setMemoryLimit(ups []proxy.Config, log zerolog.Logger) {
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok && v != "" {
		return // set but empty, the runtime takes it as unset: so does mcpheal
	}
	limit := int64(memoryHeadroom)
	for _, c := range ups {
		limit += int64(cmp.Or(c.MemoryBudget, proxy.Defaults().MemoryBudget))
	}
	debug.SetMemoryLimit(limit)
	log.Debug().Int64("bytes", limit).Msg("Go memory limit: the memory budgets plus headroom (GOMEMLIMIT overrides)")
}

// announce logs the listen URL, the operations URLs (admin is "" when the
// admin listener is off), whether the runtime keeps sysmon awake (sysmon.go)
// and, per upstream, the URL agents use.
func announce(log zerolog.Logger, rc *resolved, admin string) {
	ev := log.Info().Str("listen", "http://"+rc.listenAddr()).Int("upstreams", len(rc.ups)).
		Str("health", agentURL(rc.listenAddr(), "/healthz")).Bool("sysmon_awake", sysmonAwake(os.Getenv("GODEBUG")))
	if admin != "" {
		ev = ev.Str("metrics", agentURL(admin, "/metrics")).Str("ready", agentURL(admin, "/readyz"))
	} else {
		ev = ev.Str("admin", "off")
	}
	ev.Msg("mcpheal serving")
	announceUpstreams(log, rc)
}

// listenAddr is the agent listener's address: where it is bound, once it
// is.
func (rc *resolved) listenAddr() string {
	if rc.bound != "" {
		return rc.bound
	}
	return rc.listen
}

// announceUpstreams logs, per upstream, the URL agents use.
func announceUpstreams(log zerolog.Logger, rc *resolved) {
	for _, c := range rc.ups {
		u := agentURL(rc.listenAddr(), c.Path)
		log.Info().Str("upstream", c.Name).Str("url", u).Str("server", redact(c.Upstream)).
			Msg("agents use " + u)
	}
}

// agentURL is the URL an agent next to the proxy uses: an unspecified
// listen host (0.0.0.0, ::) is reached as 127.0.0.1.
func agentURL(listen, path string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen + path
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + path
}

// redact drops credentials and the query from a URL for logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

func newLogger(w io.Writer, level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Logger{}, fmt.Errorf("--log-level: %w", err)
	}
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	case "auto":
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
		}
	default:
		return zerolog.Logger{}, fmt.Errorf("--log-format %q: want json, console or auto", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
