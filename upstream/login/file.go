package login

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/oauth2"
)

// File is what `mcpheal login` keeps of one OAuth login to an MCP server:
// the client it registered, the authorization server's token endpoint, and
// the tokens. It is written to a file only the operator's user may read
// (Write), and read back by upstream.LoginCredentials, which keeps it
// fresh.
type File struct {
	// Server is the MCP endpoint logged in to; Resource the RFC 8707
	// resource the tokens were issued for (the server's protected resource
	// metadata names it).
	Server   string `json:"server"`
	Resource string `json:"resource"`
	Issuer   string `json:"issuer,omitempty"`
	TokenURL string `json:"token_url"`
	ClientID string `json:"client_id"`
	// ClientSecret is set for a confidential client; TokenAuth says how it
	// is sent: "client_secret_basic", "client_secret_post" or "none".
	ClientSecret string   `json:"client_secret,omitempty"`
	TokenAuth    string   `json:"token_endpoint_auth_method,omitempty"`
	Scopes       []string `json:"scopes,omitempty"`

	AccessToken  string    `json:"access_token"`
	TokenType    string    `json:"token_type,omitempty"`
	Expiry       time.Time `json:"expiry,omitzero"`
	RefreshToken string    `json:"refresh_token,omitempty"`
}

// Read reads a token file written by Write.
func Read(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f := &File{}
	if err := json.Unmarshal(b, f); err != nil {
		// json's message may quote the file; keep only where it broke.
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("%s: not a token file (bad JSON at byte %d)", path, se.Offset)
		}
		return nil, fmt.Errorf("%s: not a token file", path)
	}
	if f.TokenURL == "" || f.ClientID == "" || (f.AccessToken == "" && f.RefreshToken == "") {
		return nil, fmt.Errorf("%s: not a token file (no token_url, client_id or token)", path)
	}
	return f, nil
}

// Write writes f to path, readable and writable by its owner only (0600).
// It writes a new file beside it and renames it over path, so that a
// reader never sees half a file and a crash leaves the old one whole.
func Write(path string, f *File) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: no such file
	// CreateTemp makes the file 0600 already; say it, so that a change of
	// that default cannot widen a file of secrets.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// OAuthConfig is the oauth2 configuration of f's client and token endpoint.
func (f *File) OAuthConfig() *oauth2.Config {
	style := oauth2.AuthStyleInHeader
	if f.TokenAuth == "client_secret_post" || f.TokenAuth == "none" || f.ClientSecret == "" {
		style = oauth2.AuthStyleInParams
	}
	return &oauth2.Config{ClientID: f.ClientID, ClientSecret: f.ClientSecret, Scopes: f.Scopes,
		Endpoint: oauth2.Endpoint{TokenURL: f.TokenURL, AuthStyle: style}}
}

// Token is f's access token.
func (f *File) Token() *oauth2.Token {
	return &oauth2.Token{AccessToken: f.AccessToken, TokenType: f.TokenType, Expiry: f.Expiry}
}

// ResourceParam returns ctx with an oauth2 HTTP client that adds the RFC
// 8707 resource parameter to every token request it sends: the MCP
// authorization spec asks for it on token requests, refreshes included, and
// oauth2 has no option to add a parameter to a refresh.
func ResourceParam(ctx context.Context, resource string) context.Context {
	base := http.DefaultTransport
	var timeout time.Duration
	if hc, ok := ctx.Value(oauth2.HTTPClient).(*http.Client); ok && hc != nil {
		if hc.Transport != nil {
			base = hc.Transport
		}
		timeout = hc.Timeout
	}
	hc := &http.Client{Transport: resourceParam{base: base, resource: resource}, Timeout: timeout}
	return context.WithValue(ctx, oauth2.HTTPClient, hc)
}

type resourceParam struct {
	base     http.RoundTripper
	resource string
}

func (r resourceParam) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.resource == "" || req.Body == nil || req.Header.Get("Content-Type") != "application/x-www-form-urlencoded" {
		return r.base.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	if form, err := url.ParseQuery(string(body)); err == nil && !form.Has("resource") {
		body = append(body, "&resource="+url.QueryEscape(r.resource)...)
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return r.base.RoundTrip(out)
}
