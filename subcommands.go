package main

// Subcommands other than the proxy itself: doctor, login and healthcheck.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/proxy/doctor"
	"github.com/mcpheal/mcpheal/upstream"
	"github.com/mcpheal/mcpheal/upstream/login"
)

// runLogin is `mcpheal login -token-file FILE URL`: log in to an
// OAuth-protected MCP server once, for every agent of that upstream
// (docs/oauth.md), and keep the tokens in FILE (0600), which the upstream's
// credentials then name.
func runLogin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var hdrs, scopes listFlag
	fs := flag.NewFlagSet("mcpheal login", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("token-file", "", "where to keep the tokens (created 0600); the upstream's credentials name it (required)")
	clientID := fs.String("client-id", "", "a client registered with the authorization server beforehand (default: register dynamically)")
	secretEnv := fs.String("client-secret-env", "", "environment variable holding that client's secret, if it has one")
	redirect := fs.String("redirect-listen", "127.0.0.1:0", "loopback address for the redirect back (http://ADDR/callback); fix the port for a pre-registered client")
	fs.Var(&scopes, "scope", "scope to ask for (repeatable; default: those the server names)")
	fs.Var(&hdrs, "H", "header sent with the probe of the MCP server, e.g. a gateway's key (repeatable)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up if the login is not completed within this")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mcpheal login -token-file FILE [-client-id ID [-client-secret-env VAR]] [-scope S]... URL")
		fs.PrintDefaults()
	}
	urls, err := parseInterleaved(fs, args)
	if err != nil || len(urls) != 1 || *file == "" {
		if err == nil {
			fs.Usage()
			err = errors.New("login needs -token-file and exactly one URL, the MCP endpoint")
		}
		return err
	}
	h, err := headerFlags(hdrs)
	if err != nil {
		return err
	}
	cfg := login.Config{Server: urls[0], Header: h, ClientID: *clientID, Scopes: scopes}
	if *secretEnv != "" {
		if cfg.ClientSecret = os.Getenv(*secretEnv); cfg.ClientSecret == "" {
			return fmt.Errorf("-client-secret-env %s: not set", *secretEnv)
		}
	}
	lb, err := login.NewLoopback(*redirect, stdout)
	if err != nil {
		return fmt.Errorf("-redirect-listen: %w", err)
	}
	defer lb.Close()
	cfg.RedirectURL, cfg.Authorize = lb.RedirectURL, lb.Authorize
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	l, err := login.Login(ctx, cfg)
	if err != nil {
		return err
	}
	if err := login.Write(*file, l); err != nil {
		return err
	}
	refresh := "no refresh token: log in again when it expires"
	if l.RefreshToken != "" {
		refresh = "mcpheal refreshes it"
	}
	expires := "no stated expiry"
	if !l.Expiry.IsZero() {
		expires = "expires " + l.Expiry.Format(time.RFC3339)
	}
	fmt.Fprintf(stdout, "Logged in to %s (authorization server %s, client %s).\nTokens in %s (0600): %s; %s.\n",
		l.Server, l.Issuer, l.ClientID, *file, expires, refresh)
	return nil
}

// parseInterleaved parses fs from args, flags before or after the
// positional arguments, which it returns.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
}

// headerFlags parses -H 'Name: value' flags.
func headerFlags(hdrs []string) (http.Header, error) {
	h := http.Header{}
	for _, kv := range hdrs {
		k, v, ok := strings.Cut(kv, ":")
		if !ok {
			return nil, fmt.Errorf("-H %q: want 'Name: value'", kv)
		}
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	return h, nil
}

// runDoctor is `mcpheal doctor [-H 'Name: value']... [--upstream-login FILE]
// URL`, or `mcpheal doctor --config FILE [NAME]`: exit 0 if the proxy can
// keep sessions with that server alive, 1 if not, or if the server wants a
// login the doctor has no credential for. It probes with the credential
// mcpheal would use for the server: the login of --upstream-login, or the
// upstream's headers and credentials in the config file, each made by the
// code mcpheal's own configuration goes through (resolve).
func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var hdrs listFlag
	fs := flag.NewFlagSet("mcpheal doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&hdrs, "H", "header sent with every request, e.g. -H 'Authorization: Bearer $TOKEN' (repeatable)")
	loginFile := fs.String("upstream-login", "", "`FILE` written by mcpheal login: probe with that login, as mcpheal --upstream-login FILE would send it")
	config := fs.String("config", "", "probe an upstream of this config `FILE` as mcpheal would: its URL, headers and credentials; "+
		"the argument is then the upstream's name (needless with one upstream)")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mcpheal doctor [-H 'Name: value']... [--upstream-login FILE] [-timeout D] URL\n"+
			"       mcpheal doctor --config FILE [--upstream-login FILE] [-H 'Name: value']... [-timeout D] [NAME]")
		fs.PrintDefaults()
	}
	// Flags may come before or after the URL.
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	o := &options{config: *config, loginFile: *loginFile, listen: "127.0.0.1:0", set: map[string]bool{}}
	switch {
	case *config == "" && len(pos) != 1:
		fs.Usage()
		return errors.New("doctor needs exactly one URL, the MCP endpoint (e.g. http://127.0.0.1:3000/mcp), or --config")
	case *config == "":
		o.upstream = pos[0]
	case len(pos) > 1:
		fs.Usage()
		return errors.New("doctor --config takes at most one argument, the name of the upstream to probe")
	}
	h, err := headerFlags(hdrs)
	if err != nil {
		return err
	}
	creds := newCredCache()
	defer creds.Close()
	rc, err := resolve(o, os.LookupEnv, creds)
	if err != nil {
		return err
	}
	up, err := doctorUpstream(rc.ups, pos, *config)
	if err != nil {
		return err
	}
	for k, v := range up.Headers {
		if h.Get(k) == "" { // -H wins over the file
			h.Set(k, v)
		}
	}
	opts := doctor.Options{Header: h}
	if up.Credentials != nil {
		dc := &doctorCredential{c: up.Credentials, file: creds.tokenFile(up.Credentials)}
		switch {
		case *loginFile != "":
			dc.name = "--upstream-login " + *loginFile
		default:
			dc.name = fmt.Sprintf("the credentials of upstream %s in %s", up.Name, *config)
		}
		opts.Credential, opts.LoginFile = dc, dc.file
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := doctor.RunWith(ctx, up.Upstream, opts)
	if err != nil {
		return err
	}
	if _, err := rep.WriteTo(stdout); err != nil {
		return err
	}
	switch {
	case rep.Verdict == doctor.VerdictNeedsLogin:
		return &exitError{code: 1, err: errors.New("mcpheal cannot probe this server without a login (see the report for the command to run)")}
	case !rep.Healable():
		return &exitError{code: 1, err: errors.New("mcpheal cannot heal this server (see the report)")}
	}
	return nil
}

// doctorUpstream picks the upstream the doctor probes: the only one, or
// the one named.
func doctorUpstream(ups []proxy.Config, pos []string, file string) (proxy.Config, error) {
	if file == "" || len(pos) == 0 {
		if len(ups) != 1 {
			names := make([]string, 0, len(ups))
			for _, c := range ups {
				names = append(names, c.Name)
			}
			return proxy.Config{}, fmt.Errorf("%s has %d upstreams (%s): name the one to probe", file, len(ups), strings.Join(names, ", "))
		}
		return ups[0], nil
	}
	for _, c := range ups {
		if c.Name == pos[0] {
			return c, nil
		}
	}
	return proxy.Config{}, fmt.Errorf("%s has no upstream named %q", file, pos[0])
}

// doctorCredential is an upstream's credential as the doctor sends it:
// the object mcpheal itself would use (credCache), applied to each request
// as the proxy applies it, and dropped after a 401 as the proxy drops it.
type doctorCredential struct {
	c    upstream.Credentials
	name string // how the report names it
	file string // the token file of mcpheal login it reads, if it is one
}

func (d *doctorCredential) Header(ctx context.Context) (http.Header, error) {
	var fh fasthttp.RequestHeader
	if err := d.c.Apply(ctx, &fh); err != nil {
		return nil, err
	}
	h := http.Header{}
	for k, v := range fh.All() {
		h.Add(string(k), string(v))
	}
	return h, nil
}

func (d *doctorCredential) Refused(h http.Header) { d.c.Invalidate(h.Get("Authorization")) }

func (d *doctorCredential) String() string {
	if d.file != "" && !strings.Contains(d.name, d.file) {
		return d.name + " (token file " + d.file + ")"
	}
	return d.name
}

// tokenFile is the token file of `mcpheal login` that cr reads, if c made
// cr from one (credentials: {oauth: {token_file: …}} or --upstream-login).
func (c *credCache) tokenFile(cr upstream.Credentials) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.m {
		if v == cr {
			return k.tokenFile
		}
	}
	return ""
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
