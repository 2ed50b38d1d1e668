package main

// Subcommands other than the proxy itself: doctor and healthcheck.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/mcpheal/mcpheal/proxy/doctor"
)

// runDoctor is `mcpheal doctor [-H 'Name: value']... URL`: exit 0 if the
// proxy can keep sessions with that server alive, 1 if not.
func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var hdrs listFlag
	fs := flag.NewFlagSet("mcpheal doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&hdrs, "H", "header sent with every request, e.g. -H 'Authorization: Bearer $TOKEN' (repeatable)")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mcpheal doctor [-H 'Name: value']... [-timeout D] URL")
		fs.PrintDefaults()
	}
	// Flags may come before or after the URL.
	var urls []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		urls, args = append(urls, fs.Arg(0)), fs.Args()[1:]
	}
	if len(urls) != 1 {
		fs.Usage()
		return errors.New("doctor needs exactly one URL, the MCP endpoint (e.g. http://127.0.0.1:3000/mcp)")
	}
	h := http.Header{}
	for _, kv := range hdrs {
		k, v, ok := strings.Cut(kv, ":")
		if !ok {
			return fmt.Errorf("-H %q: want 'Name: value'", kv)
		}
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := doctor.Run(ctx, urls[0], h)
	if err != nil {
		return err
	}
	if _, err := rep.WriteTo(stdout); err != nil {
		return err
	}
	if !rep.Healable() {
		return &exitError{code: 1, err: errors.New("mcpheal cannot heal this server (see the report)")}
	}
	return nil
}

// runHealthcheck is `mcpheal healthcheck [URL]`: GET the proxy's /healthz
// (default http://127.0.0.1:8787/healthz) and exit 0 on 200, 1 otherwise.
// It exists for images without curl (distroless, scratch).
func runHealthcheck(ctx context.Context, args []string, stderr io.Writer) error {
	u := "http://127.0.0.1:8787/healthz"
	switch len(args) {
	case 0:
	case 1:
		u = args[0]
	default:
		fmt.Fprintln(stderr, "usage: mcpheal healthcheck [URL]")
		return errors.New("healthcheck takes at most one URL")
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("unhealthy: %w", err)}
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: 1, err: fmt.Errorf("unhealthy: %s answered %d", u, resp.StatusCode)}
	}
	return nil
}
