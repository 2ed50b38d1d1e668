package main

// Upstream credentials the proxy owns (docs/security.md "Security"), from the config file.

import (
	"net/url"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/mcpheal/mcpheal/upstream"
)

// credSpec is an upstream credential the proxy owns: a static header, an
// OAuth 2.0 client credentials or refresh token grant, or the login of
// `mcpheal login`.
type credSpec struct {
	Header, Value string // static; Header defaults to Authorization
	OAuth         *oauthSpec
}

type oauthSpec struct {
	TokenURL, ClientID, ClientSecret, RefreshToken string
	Scopes                                         []string
	// TokenFile is a login `mcpheal login` made (docs/oauth.md); it
	// stands alone: the client and the token endpoint are in the file.
	TokenFile string
}

// credentials parses an upstream's credentials entry.
func (p *parser) credentials(n *yaml.Node, path string) *credSpec {
	c := &credSpec{}
	p.mapping(n, path+".", credKeys, func(key string, _, v *yaml.Node) {
		kp := path + "." + key
		switch key {
		case "header":
			c.Header = p.str(v, kp)
		case "value":
			c.Value = p.secret(v, kp, `"Bearer ${TOKEN}"`)
		case "oauth":
			c.OAuth = p.oauth(v, kp)
		}
	})
	switch {
	case c.OAuth != nil && (c.Value != "" || c.Header != ""):
		p.errorf(n, path, "set either header and value, or oauth, not both")
	case c.OAuth == nil && c.Value == "":
		p.errorf(n, path, "needs value (a static credential) or oauth")
	}
	if c.Header == "" {
		c.Header = "Authorization"
	}
	return c
}

func (p *parser) oauth(n *yaml.Node, path string) *oauthSpec {
	o := &oauthSpec{}
	p.mapping(n, path+".", oauthKeys, func(key string, _, v *yaml.Node) {
		kp := path + "." + key
		switch key {
		case "token_url":
			o.TokenURL = p.expand(v, kp, p.str(v, kp))
			if u, err := url.Parse(o.TokenURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				p.errorf(v, kp, "want an http(s) URL, got %q", o.TokenURL)
			}
		case "client_id":
			o.ClientID = p.expand(v, kp, p.str(v, kp))
		case "client_secret":
			o.ClientSecret = p.secret(v, kp, `"${CLIENT_SECRET}"`)
		case "refresh_token":
			o.RefreshToken = p.secret(v, kp, `"${REFRESH_TOKEN}"`)
		case "scopes":
			o.Scopes = p.strs(v, kp)
		case "token_file":
			o.TokenFile = p.expand(v, kp, p.str(v, kp))
		}
	})
	switch {
	case o.TokenFile != "" && (o.TokenURL != "" || o.ClientID != "" || o.ClientSecret != "" || o.RefreshToken != "" || len(o.Scopes) > 0):
		p.errorf(n, path, "token_file stands alone: the login it holds names its client and token endpoint")
	case o.TokenFile == "" && (o.TokenURL == "" || o.ClientID == ""):
		p.errorf(n, path, "needs token_url and client_id (or token_file, from mcpheal login)")
	}
	return o
}

// credCache keeps one upstream.Credentials per distinct credentials entry,
// so that a reload that keeps an entry keeps its object: its cached token
// survives, and the router sees that upstream's config unchanged. Close
// releases them all when the process ends.
type credCache struct {
	mu sync.Mutex // protects m
	m  map[credKey]upstream.Credentials
}

type credKey struct {
	header, value, tokenURL, clientID, clientSecret, refreshToken, scopes, tokenFile string
}

func newCredCache() *credCache { return &credCache{m: map[credKey]upstream.Credentials{}} }

// get returns the Credentials for spec, creating them on first use.
func (c *credCache) get(spec *credSpec) upstream.Credentials {
	k := credKey{header: spec.Header, value: spec.Value}
	if o := spec.OAuth; o != nil {
		k = credKey{tokenURL: o.TokenURL, clientID: o.ClientID, clientSecret: o.ClientSecret,
			refreshToken: o.RefreshToken, scopes: strings.Join(o.Scopes, " "), tokenFile: o.TokenFile}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cr, ok := c.m[k]; ok {
		return cr
	}
	var cr upstream.Credentials
	switch o := spec.OAuth; {
	case o == nil:
		cr = upstream.StaticHeader(spec.Header, spec.Value)
	case o.TokenFile != "":
		cr = upstream.LoginCredentials(o.TokenFile)
	case o.RefreshToken != "":
		cr = upstream.RefreshToken(&oauth2.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret,
			Endpoint: oauth2.Endpoint{TokenURL: o.TokenURL}, Scopes: o.Scopes}, o.RefreshToken)
	default:
		cr = upstream.ClientCredentials(&clientcredentials.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret,
			TokenURL: o.TokenURL, Scopes: o.Scopes})
	}
	c.m[k] = cr
	return cr
}

// Close releases every Credentials made. Idempotent.
func (c *credCache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cr := range c.m {
		cr.Close()
		delete(c.m, k)
	}
}
