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
// credential.
func (d *prober) needsAuthProbe(r *Report) bool {
	if d.hdr.Get("Authorization") != "" {
		return true
	}
	for _, v := range r.Versions {
		if v.Status == http.StatusUnauthorized {
			return true
		}
	}
	return false
}

// describe prints the probe: how the server authenticates, then what each
// way of logging in through mcpheal needs.
func (p *AuthProbe) describe(line func(k, f string, a ...any), url string) {
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
	how := "mcpheal login -token-file FILE " + url
	if !p.Dynamic {
		how += " -client-id ID (register mcpheal first: no dynamic registration)"
	}
	refresh := "no offline_access scope offered: expect to log in again when the token expires"
	if p.RefreshTokens {
		refresh = "refresh tokens offered (offline_access): mcpheal renews the login itself"
	}
	line("mcpheal login", "works with any audience check: %s; %s", how, refresh)
}
