package login

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Discovery is how an MCP server says it authenticates.
type Discovery struct {
	// Status is the HTTP status of the unauthenticated probe; Required is
	// true when it was 401.
	Status   int
	Required bool
	// Challenge is the probe's WWW-Authenticate, MetadataURL where the
	// protected resource metadata was found.
	Challenge, MetadataURL string
	// Resource is the metadata's resource (RFC 8707 resource indicator);
	// Scopes the challenge's scope, else the metadata's scopes_supported.
	Resource string
	Scopes   []string
	// AuthServer is the first authorization server's metadata.
	AuthServer *AuthServer
}

// AuthServer is the part of an authorization server's metadata (RFC 8414)
// a login uses.
type AuthServer struct {
	Issuer                string   `json:"issuer"`
	AuthorizationEndpoint string   `json:"authorization_endpoint"`
	TokenEndpoint         string   `json:"token_endpoint"`
	RegistrationEndpoint  string   `json:"registration_endpoint"`
	ScopesSupported       []string `json:"scopes_supported"`
	CodeChallengeMethods  []string `json:"code_challenge_methods_supported"`
	IssParameter          bool     `json:"authorization_response_iss_parameter_supported"`
	CIMD                  bool     `json:"client_id_metadata_document_supported"`
}

// probe is the unauthenticated request: an initialize, which every MCP
// server of the session era and 2026-07-28 server answers, and which an
// OAuth-protected one refuses with 401 before reading.
const probe = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25",` +
	`"capabilities":{},"clientInfo":{"name":"mcpheal-login","version":"1"}}}`

// Discover asks server how it authenticates. An error means it could not
// tell; a server that needs no login is Required false.
func Discover(ctx context.Context, hc *http.Client, server string, header http.Header) (*Discovery, error) {
	su, err := url.Parse(server)
	if err != nil || (su.Scheme != "http" && su.Scheme != "https") || su.Host == "" {
		return nil, errorf("%q is not an http(s) URL", server)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, server, strings.NewReader(probe))
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", server, err)
	}
	resp.Body.Close()
	d := &Discovery{Status: resp.StatusCode, Required: resp.StatusCode == http.StatusUnauthorized,
		Challenge: resp.Header.Get("WWW-Authenticate")}
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		endSession(ctx, hc, server, header, sid) // the probe opened a session: close it
	}
	if !d.Required {
		return d, nil
	}
	params := challengeParams(d.Challenge)
	if s := params["scope"]; s != "" {
		d.Scopes = strings.Fields(s)
	}
	var prm struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
		ScopesSupported      []string `json:"scopes_supported"`
	}
	for _, u := range prmURLs(su, params["resource_metadata"]) {
		if ok, err := getJSON(ctx, hc, u, &prm); err != nil {
			return nil, err
		} else if ok {
			d.MetadataURL = u
			break
		}
	}
	switch {
	case d.MetadataURL == "":
		return nil, errorf("%s asks for a login (401) but publishes no protected resource metadata (RFC 9728): "+
			"give mcpheal a static credential instead (docs/oauth.md)", server)
	case len(prm.AuthorizationServers) == 0:
		return nil, errorf("%s names no authorization server", d.MetadataURL)
	case !covers(prm.Resource, su):
		return nil, errorf("%s names resource %q, which is not %s: refused (RFC 9728 §3.3)", d.MetadataURL, prm.Resource, server)
	}
	d.Resource = prm.Resource
	if len(d.Scopes) == 0 {
		d.Scopes = prm.ScopesSupported
	}
	issuer := prm.AuthorizationServers[0]
	iu, err := url.Parse(issuer)
	if err != nil || (iu.Scheme != "http" && iu.Scheme != "https") || iu.Host == "" {
		return nil, errorf("%s names authorization server %q, not an http(s) URL", d.MetadataURL, issuer)
	}
	for _, u := range asURLs(iu) {
		as := &AuthServer{}
		ok, err := getJSON(ctx, hc, u, as)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if strings.TrimSuffix(as.Issuer, "/") != strings.TrimSuffix(issuer, "/") {
			return nil, errorf("%s names issuer %q, not %q: refused (RFC 8414 §3.3)", u, as.Issuer, issuer)
		}
		if as.AuthorizationEndpoint == "" || as.TokenEndpoint == "" {
			return nil, errorf("%s has no authorization or token endpoint", u)
		}
		d.AuthServer = as
		return d, nil
	}
	return nil, errorf("the authorization server %s publishes no metadata (RFC 8414 or OpenID Connect discovery)", issuer)
}

// covers reports whether the metadata's resource names server: the same
// origin, and a path that is server's or a prefix of it at a segment.
func covers(resource string, server *url.URL) bool {
	ru, err := url.Parse(resource)
	if err != nil || !strings.EqualFold(ru.Scheme, server.Scheme) || !strings.EqualFold(ru.Host, server.Host) {
		return false
	}
	rp, sp := strings.TrimSuffix(ru.Path, "/"), strings.TrimSuffix(server.Path, "/")
	return rp == sp || strings.HasPrefix(sp, rp+"/")
}

// prmURLs are where to look for the protected resource metadata: the
// challenge's, then RFC 9728 §3.1's for the path, then the origin's.
func prmURLs(server *url.URL, fromChallenge string) []string {
	var us []string
	if fromChallenge != "" {
		us = append(us, fromChallenge)
	}
	origin := server.Scheme + "://" + server.Host
	if p := strings.TrimSuffix(server.Path, "/"); p != "" {
		us = append(us, origin+"/.well-known/oauth-protected-resource"+p)
	}
	return append(us, origin+"/.well-known/oauth-protected-resource")
}

// asURLs are where to look for an authorization server's metadata (the MCP
// authorization spec's order): RFC 8414, then OpenID Connect discovery
// with the path inserted, then appended.
func asURLs(issuer *url.URL) []string {
	origin := issuer.Scheme + "://" + issuer.Host
	p := strings.TrimSuffix(issuer.Path, "/")
	if p == "" {
		return []string{origin + "/.well-known/oauth-authorization-server", origin + "/.well-known/openid-configuration"}
	}
	return []string{origin + "/.well-known/oauth-authorization-server" + p,
		origin + "/.well-known/openid-configuration" + p, origin + p + "/.well-known/openid-configuration"}
}

// getJSON fetches u into v: ok false for a 404 (or another 4xx), an error
// for an answer that is neither.
func getJSON(ctx context.Context, hc *http.Client, u string, v any) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, errorf("%q: %v", u, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	status, err := doJSON(hc, req, v)
	switch {
	case err != nil:
		return false, fmt.Errorf("%s: %w", u, err)
	case status/100 == 2:
		return true, nil
	case status/100 == 4:
		return false, nil
	}
	return false, errorf("%s: HTTP %d", u, status)
}

// endSession DELETEs a session the probe opened.
func endSession(ctx context.Context, hc *http.Client, server string, header http.Header, sid string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, server, nil)
	if err != nil {
		return
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Mcp-Session-Id", sid)
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
	}
}

// challengeParams are the auth-params of a Bearer challenge (RFC 9110
// §11.2): name=token or name="quoted string", lower-cased names.
func challengeParams(h string) map[string]string {
	out := map[string]string{}
	i := strings.IndexByte(h, ' ')
	if i < 0 || !strings.EqualFold(h[:i], "Bearer") {
		return out
	}
	s := h[i+1:]
	for s != "" {
		s = strings.TrimLeft(s, " ,")
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			break
		}
		name := strings.ToLower(strings.TrimSpace(s[:eq]))
		if name == "" {
			break // not an auth-param: the rest is not read
		}
		s = strings.TrimLeft(s[eq+1:], " ")
		var val string
		if strings.HasPrefix(s, `"`) {
			var b strings.Builder
			j := 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			val, s = b.String(), s[min(j+1, len(s)):]
		} else {
			end := strings.IndexByte(s, ',')
			if end < 0 {
				end = len(s)
			}
			val, s = strings.TrimSpace(s[:end]), s[end:]
		}
		out[name] = val
	}
	return out
}
