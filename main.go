// Command mcpheal is a sidecar proxy that keeps MCP Streamable HTTP sessions
// alive: agents point at it instead of at the MCP server, and it re-creates
// upstream sessions that died and replays the request, so the agent never
// notices.
//
//	mcpheal --upstream http://127.0.0.1:3000/mcp        # serves http://127.0.0.1:8787/mcp
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mcpheal:", err)
		os.Exit(2)
	}
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func run(args []string, stderr io.Writer) error {
	var (
		cfg       proxy.Config
		logLevel  string
		logFormat string
		hosts     listFlag
		tools     listFlag
	)
	fs := flag.NewFlagSet("mcpheal", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Upstream, "upstream", "", "MCP server endpoint to heal, e.g. http://127.0.0.1:3000/mcp (required)")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8787", "address to serve agents on")
	fs.StringVar(&cfg.Path, "path", "/mcp", "URL path agents use")
	fs.DurationVar(&cfg.HealTimeout, "heal-timeout", 15*time.Second, "most a request may spend healing before it gets 503")
	fs.DurationVar(&cfg.ResponseTimeout, "response-timeout", 5*time.Minute, "wait for the head of an upstream answer")
	fs.DurationVar(&cfg.SessionTTL, "session-ttl", 24*time.Hour, "drop a client session idle this long")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", 100_000, "most live client sessions")
	fs.IntVar(&cfg.MaxBody, "max-body", 4<<20, "largest agent request body in bytes (413 beyond)")
	fs.DurationVar(&cfg.MaxIdleConn, "max-idle-conn", 30*time.Second, "close pooled upstream connections idle this long")
	fs.Var(&hosts, "allow-host", "extra Host name accepted by the DNS-rebinding guard (repeatable)")
	fs.Var(&tools, "replay-tool", "tool safe to run twice although not annotated so (repeatable)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&logFormat, "log-format", "auto", "json, console, or auto (console on a terminal)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if cfg.Upstream == "" {
		fs.Usage()
		return errors.New("--upstream is required")
	}
	cfg.AllowedHosts, cfg.ReplayTools = hosts, tools
	log, err := newLogger(stderr, logLevel, logFormat)
	if err != nil {
		return err
	}
	srv, err := proxy.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info().Str("listen", "http://"+cfg.Listen+cfg.Path).Str("upstream", cfg.Upstream).Msg("mcpheal serving")
	select {
	case err := <-errc:
		srv.Close()
		return err
	case <-ctx.Done():
	}
	log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
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
