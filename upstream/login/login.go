// Package login is `mcpheal login`: mcpheal logs in to an OAuth-protected
// MCP server once, for every agent of that upstream (docs/oauth.md).
//
// It follows the MCP authorization spec as a client would: an
// unauthenticated request gets a 401 whose challenge names the protected
// resource metadata (RFC 9728; the well-known locations otherwise), which
// names the authorization server, whose metadata (RFC 8414, or OpenID
// Connect discovery) gives its endpoints. The client is registered
// dynamically (RFC 7591) unless the operator gives a client id; the
// authorization code flow runs with PKCE (S256) and the RFC 8707 resource
// parameter on every request, so the tokens are issued for the server
// itself. The user's part (opening a URL, the redirect back) is the
// caller's: Loopback serves it for a terminal. The result is a File,
// which upstream.LoginCredentials reads and keeps fresh.
//
// Nothing here logs, and no error message holds a token, a code or a
// client secret.
package login

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/oauth2"
)

// Config is one login.
type Config struct {
	// Server is the MCP endpoint, as mcpheal's upstream URL names it.
	Server string
	// Header is sent with every request to Server (not to the
	// authorization server): a static header an operator adds, say.
	Header http.Header
	// ClientID (and ClientSecret for a confidential client) name a client
	// registered with the authorization server beforehand; empty: mcpheal
	// registers itself dynamically.
	ClientID, ClientSecret string
	// Scopes to ask for; empty: those the server's challenge names, else
	// its metadata's scopes_supported.
	Scopes []string
	// RedirectURL is where the authorization server sends the browser
	// back; Authorize must be listening there.
	RedirectURL string
	// Authorize is the user's part: show authURL, wait for the redirect to
	// RedirectURL and return its query.
	Authorize func(ctx context.Context, authURL string) (url.Values, error)
	// HTTP is the client for every request; nil: a client with a 30 s
	// timeout.
	HTTP *http.Client
}

// Error is a login that cannot go on, with what the operator can do.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func errorf(format string, a ...any) error { return &Error{Msg: fmt.Sprintf(format, a...)} }

// Login runs the flow and returns what to keep (Write).
func Login(ctx context.Context, c Config) (*File, error) {
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: 30 * time.Second}
	}
	if c.Authorize == nil || c.RedirectURL == "" {
		return nil, errors.New("login: Authorize and RedirectURL are required")
	}
	d, err := Discover(ctx, c.HTTP, c.Server, c.Header)
	if err != nil {
		return nil, err
	}
	if !d.Required {
		return nil, errorf("%s answered without a login (HTTP %d): nothing to log in to", c.Server, d.Status)
	}
	as := d.AuthServer
	if !slices.Contains(as.CodeChallengeMethods, "S256") {
		return nil, errorf("the authorization server %s does not say it supports PKCE (S256), which MCP requires", as.Issuer)
	}
	l := &File{Server: c.Server, Resource: d.Resource, Issuer: as.Issuer, TokenURL: as.TokenEndpoint,
		ClientID: c.ClientID, ClientSecret: c.ClientSecret, Scopes: c.Scopes}
	if len(l.Scopes) == 0 {
		l.Scopes = d.Scopes
	}
	if slices.Contains(as.ScopesSupported, "offline_access") && !slices.Contains(l.Scopes, "offline_access") {
		l.Scopes = append(l.Scopes, "offline_access") // a refresh token, so that the login lasts
	}
	switch {
	case l.ClientID != "":
		l.TokenAuth = "client_secret_basic"
		if l.ClientSecret == "" {
			l.TokenAuth = "none"
		}
	case as.RegistrationEndpoint != "":
		if err := register(ctx, c.HTTP, as, c.RedirectURL, l); err != nil {
			return nil, err
		}
	default:
		return nil, errorf("the authorization server %s offers no dynamic client registration: register mcpheal "+
			"with it (redirect URI %s) and pass -client-id", as.Issuer, c.RedirectURL)
	}
	cfg := l.OAuthConfig()
	cfg.Endpoint.AuthURL = as.AuthorizationEndpoint
	cfg.RedirectURL = c.RedirectURL
	verifier, state := oauth2.GenerateVerifier(), random()
	authURL := cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("resource", l.Resource))
	q, err := c.Authorize(ctx, authURL)
	if err != nil {
		return nil, err
	}
	if e := q.Get("error"); e != "" {
		return nil, errorf("the authorization server refused the login: %s", code(e))
	}
	if q.Get("state") != state {
		return nil, errorf("the redirect back carried another login's state: refused")
	}
	if iss := q.Get("iss"); (iss != "" || as.IssParameter) && iss != as.Issuer {
		return nil, errorf("the redirect back names issuer %q, not %q: refused (RFC 9207)", iss, as.Issuer)
	}
	if q.Get("code") == "" {
		return nil, errorf("the redirect back carried no authorization code")
	}
	hctx := ResourceParam(context.WithValue(ctx, oauth2.HTTPClient, c.HTTP), l.Resource)
	t, err := cfg.Exchange(hctx, q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			return nil, errorf("the authorization server refused the code: HTTP %d %s", re.Response.StatusCode, code(re.ErrorCode))
		}
		return nil, fmt.Errorf("token request: %w", err)
	}
	l.AccessToken, l.TokenType, l.Expiry, l.RefreshToken = t.AccessToken, t.TokenType, t.Expiry, t.RefreshToken
	return l, nil
}

// code is an OAuth error code fit to repeat: registered characters only
// (RFC 6749 §5.2), at most 64 of them.
func code(s string) string {
	if len(s) > 64 || strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e || r == '"' || r == '\\' }) >= 0 {
		return "(unreadable error code)"
	}
	return s
}

func random() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// register is dynamic client registration (RFC 7591): a public client
// (no secret) whose one redirect URI is redirectURL.
func register(ctx context.Context, hc *http.Client, as *AuthServer, redirectURL string, l *File) error {
	body, _ := json.Marshal(map[string]any{
		"client_name":                "mcpheal",
		"redirect_uris":              []string{redirectURL},
		"grant_types":                []string{"authorization_code", "refresh_token"},
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": "none",
		"scope":                      strings.Join(l.Scopes, " "),
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, as.RegistrationEndpoint, strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	var got struct {
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
		Method       string `json:"token_endpoint_auth_method"`
		Error        string `json:"error"`
	}
	status, err := doJSON(hc, req, &got)
	switch {
	case err != nil:
		return fmt.Errorf("client registration at %s: %w", as.RegistrationEndpoint, err)
	case status/100 != 2 || got.ClientID == "":
		return errorf("client registration at %s: HTTP %d %s; register mcpheal by hand (redirect URI %s) and pass -client-id",
			as.RegistrationEndpoint, status, code(got.Error), redirectURL)
	}
	l.ClientID, l.ClientSecret, l.TokenAuth = got.ClientID, got.ClientSecret, got.Method
	if l.TokenAuth == "" {
		l.TokenAuth = "client_secret_basic" // RFC 7591 §2's default
		if l.ClientSecret == "" {
			l.TokenAuth = "none"
		}
	}
	return nil
}

// doJSON sends req and decodes a JSON answer of at most 1 MiB into v,
// whatever its status; the status is returned.
func doJSON(hc *http.Client, req *http.Request, v any) (int, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if json.Unmarshal(b, v) != nil && resp.StatusCode/100 == 2 {
		return resp.StatusCode, fmt.Errorf("HTTP %d, not JSON", resp.StatusCode)
	}
	return resp.StatusCode, nil
}
