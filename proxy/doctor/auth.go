package doctor

import (
	"context"
	"net/http"
	"slices"
	"strings"

	"github.com/mcpheal/mcpheal/upstream/login"
)

// AuthProbe is how the server authenticates (docs/oauth.md), learnt as a
// client that is about to log in learns it, and which of mcpheal's two
// ways of logging in suit it. It holds no credential.
type AuthProbe struct {
	// Status is the unauthenticated probe's; Required means 401.
	Status   int
	Required bool
	// OAuth: the server publishes protected resource metadata naming an
	// authorization server whose metadata was found.
	OAuth                                       bool
	Resource, Issuer                            string
	Dynamic, CIMD, PKCE, RefreshTokens, IssResp bool
	// Err says why the discovery stopped short ("" when it did not).
	Err string
}

// auth probes without the Authorization header given: a login is what an
// agent without one meets.
func (d *prober) auth(ctx context.Context) *AuthProbe {
	hdr := d.hdr.Clone()
	hdr.Del("Authorization")
	disc, err := login.Discover(ctx, d.c, d.url, hdr)
	p := &AuthProbe{}
	if err != nil {
		p.Required = true // only a 401 gets as far as an error
		p.Err = err.Error()
		return p
	}
	p.Status, p.Required = disc.Status, disc.Required
	if as := disc.AuthServer; as != nil {
		p.OAuth, p.Resource, p.Issuer = true, disc.Resource, as.Issuer
		p.Dynamic, p.CIMD = as.RegistrationEndpoint != "", as.CIMD
		p.PKCE = slices.Contains(as.CodeChallengeMethods, "S256")
		p.RefreshTokens = slices.Contains(as.ScopesSupported, "offline_access")
		p.IssResp = as.IssParameter
	}
	return p
}

// needsAuthProbe: a version probe met a 401, or the caller sends a
// credential (with -H, or mcpheal's own).
func (d *prober) needsAuthProbe(r *Report) bool {
	return d.hdr.Get("Authorization") != "" || r.Credential != nil || r.unauthorized()
}

// unauthorized reports whether a version probe met a 401.
func (r *Report) unauthorized() bool {
	for _, v := range r.Versions {
		if v.Status == http.StatusUnauthorized {
			return true
		}
	}
	return false
}

// loginCommand is the `mcpheal login` that logs mcpheal in to url, its
// tokens kept in file.
func (p *AuthProbe) loginCommand(file, url string) string {
	how := "mcpheal login -token-file " + file + " " + url
	if !p.Dynamic {
		how += " -client-id ID (register mcpheal first: no dynamic registration)"
	}
	return how
}

// loginNotes say, for a server mcpheal cannot probe without a login
// (VerdictNeedsLogin), why and what to run.
func (r *Report) loginNotes() []string {
	a := r.Auth
	if a == nil {
		a = &AuthProbe{}
	}
	c := r.Credential
	file := "FILE"
	if c != nil && c.LoginFile != "" {
		file = c.LoginFile
	}
	var notes []string
	switch {
	case c != nil && c.Err != "":
		notes = append(notes, "mcpheal's credential cannot be had: "+c.Err+"; until it can, mcpheal sends this server "+
			"no request, and every agent gets that error")
		if !a.Required {
			return notes
		}
	case c != nil && c.Refused:
		notes = append(notes, "the server refuses mcpheal's credential ("+c.From+") with 401, a new token included")
	case r.authGiven:
		notes = append(notes, "the server refuses the Authorization given (401)")
	default:
		what := "a login"
		if a.OAuth {
			what = "an OAuth login"
		}
		notes = append(notes, "the server wants "+what+" (401), and the doctor was given no credential: "+
			"nothing is known of its sessions yet")
	}
	switch {
	case !a.OAuth:
		return append(notes, "it is not an OAuth login mcpheal can run: give mcpheal a static credential "+
			"(the upstream's headers: or credentials:) and run the doctor again with it (-H, or --config FILE)")
	case !a.PKCE:
		return append(notes, "its OAuth login lacks PKCE (S256), which mcpheal login needs: give mcpheal a static "+
			"credential and run the doctor again with it (-H, or --config FILE)")
	}
	return append(notes, "it is an OAuth login: log mcpheal in once with "+a.loginCommand(file, r.URL)+
		", then probe as mcpheal will with mcpheal doctor --upstream-login "+file+" "+r.URL+
		" (mcpheal itself: --upstream-login "+file+", or credentials: {oauth: {token_file: "+file+"}})")
}

// describe prints the probe: how the server authenticates, then what each
// way of logging in through mcpheal needs.
func (p *AuthProbe) describe(line func(k, f string, a ...any), url, file string) {
	switch {
	case !p.Required:
		line("auth", "none asked: an unauthenticated initialize got %d", p.Status)
		return
	case !p.OAuth:
		line("auth", "a login is required (401), but not one mcpheal can run: %s", p.Err)
		line("", "give mcpheal a static credential (credentials: {value: ...}) or pass the agent's through")
		return
	}
	var reg []string
	if p.Dynamic {
		reg = append(reg, "dynamic client registration")
	}
	if p.CIMD {
		reg = append(reg, "client id metadata documents")
	}
	if len(reg) == 0 {
		reg = append(reg, "pre-registered clients only")
	}
	line("auth", "OAuth: resource %s, authorization server %s (%s)", p.Resource, p.Issuer, strings.Join(reg, ", "))
	if !p.PKCE {
		line("agent login", "no: the authorization server does not say it supports PKCE (S256), which MCP clients require")
		line("mcpheal login", "no, for the same reason; give mcpheal a static credential")
		return
	}
	line("agent login", "through mcpheal, if the authorization server issues tokens for mcpheal's URL and the server "+
		"does not check its tokens' audience (not visible from outside: docs/oauth.md)")
	how := p.loginCommand(file, url)
	refresh := "no offline_access scope offered: expect to log in again when the token expires"
	if p.RefreshTokens {
		refresh = "refresh tokens offered (offline_access): mcpheal renews the login itself"
	}
	line("mcpheal login", "works with any audience check: %s; %s", how, refresh)
}
