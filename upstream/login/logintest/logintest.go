// Package logintest is an OAuth-protected MCP server in one process, for
// the tests of `mcpheal login` and `mcpheal doctor`: a Go SDK server behind
// the SDK's bearer-token middleware, with its own authorization server on
// the same origin (protected resource metadata, RFC 8414 metadata, dynamic
// client registration, the authorization code flow with PKCE, the refresh
// token grant).
//
// It is strict, as the servers `mcpheal login` exists for are: tokens are
// issued only for the MCP server's own URL as the RFC 8707 resource, and
// accepted only while unexpired and not revoked. The authorization endpoint
// approves at once: a test plays the user's browser by following its
// redirect to the client's redirect URI.
package logintest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TokenTTL is the lifetime of the access tokens the server issues.
const TokenTTL = time.Hour

// Server is one OAuth-protected MCP server and its authorization server.
type Server struct {
	// URL is the MCP endpoint (Issuer + "/mcp"); Issuer the authorization
	// server's issuer identifier.
	URL, Issuer string

	srv *mcp.Server
	hs  *httptest.Server

	mu      sync.Mutex
	clients map[string]string    // registered client id → its one redirect URI
	codes   map[string]grant     // authorization codes not yet exchanged
	access  map[string]time.Time // live access token → its expiry
	refresh map[string]bool      // live refresh tokens
	issued  int                  // access tokens issued
	refused int                  // MCP requests answered 401
}

// grant is what an authorization code was issued for.
type grant struct{ client, redirect, challenge string }

// Start serves a new server on 127.0.0.1 until the test ends. Its MCP
// server has one tool, echo, which returns its text argument.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{clients: map[string]string{}, codes: map[string]grant{}, access: map[string]time.Time{}, refresh: map[string]bool{}}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: "oauth-peer", Version: "1"}, nil)
	type echoIn struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s.srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
	})
	mux := http.NewServeMux()
	s.hs = httptest.NewServer(mux)
	s.Issuer, s.URL = s.hs.URL, s.hs.URL+"/mcp"
	prm := s.Issuer + "/.well-known/oauth-protected-resource/mcp"
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.srv }, nil)
	protected := auth.RequireBearerToken(s.verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: prm})(mcpHandler)
	mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusWriter{ResponseWriter: w}
		protected.ServeHTTP(rec, r)
		if rec.status == http.StatusUnauthorized {
			s.mu.Lock()
			s.refused++
			s.mu.Unlock()
		}
	}))
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"resource": s.URL, "authorization_servers": []string{s.Issuer},
			"scopes_supported": []string{"mcp"}})
	})
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"issuer": s.Issuer,
			"authorization_endpoint": s.Issuer + "/authorize", "token_endpoint": s.Issuer + "/token",
			"registration_endpoint":                          s.Issuer + "/register",
			"scopes_supported":                               []string{"mcp", "offline_access"},
			"code_challenge_methods_supported":               []string{"S256"},
			"authorization_response_iss_parameter_supported": true})
	})
	mux.HandleFunc("POST /register", s.register)
	mux.HandleFunc("GET /authorize", s.authorize)
	mux.HandleFunc("POST /token", s.token)
	t.Cleanup(func() {
		for ss := range s.srv.Sessions() {
			_ = ss.Close()
		}
		s.hs.CloseClientConnections()
		s.hs.Close()
	})
	return s
}

// Revoke ends every access token issued so far (refresh tokens stay good),
// as an authorization server that revokes a token before its expiry does.
func (s *Server) Revoke() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.access)
}

// Issued is the number of access tokens issued, refreshes included.
func (s *Server) Issued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.issued
}

// Refused is the number of requests to the MCP endpoint answered 401.
func (s *Server) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

func (s *Server) verify(_ context.Context, tok string, _ *http.Request) (*auth.TokenInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.access[tok]
	if !ok || time.Now().After(exp) {
		return nil, auth.ErrInvalidToken
	}
	return &auth.TokenInfo{UserID: "operator", Scopes: []string{"mcp"}, Expiration: exp}, nil
}

// register is dynamic client registration (RFC 7591) of a public client
// with one redirect URI.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	var req struct {
		RedirectURIs []string `json:"redirect_uris"`
	}
	if json.NewDecoder(r.Body).Decode(&req) != nil || len(req.RedirectURIs) != 1 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_redirect_uri"})
		return
	}
	id := random()
	s.mu.Lock()
	s.clients[id] = req.RedirectURIs[0]
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, map[string]any{"client_id": id, "redirect_uris": req.RedirectURIs,
		"token_endpoint_auth_method": "none"})
}

// authorize approves at once: a code for the registered client, PKCE
// (S256) and the server's own URL as the resource, sent back to the
// client's redirect URI with the state and the issuer (RFC 9207).
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	s.mu.Lock()
	redirect, ok := s.clients[q.Get("client_id")]
	s.mu.Unlock()
	switch {
	case !ok || q.Get("redirect_uri") != redirect:
		http.Error(w, "unknown client or redirect URI", http.StatusBadRequest)
		return
	case q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "":
		http.Error(w, "the authorization code flow with PKCE (S256) only", http.StatusBadRequest)
		return
	case q.Get("resource") != s.URL:
		http.Error(w, "tokens are issued for "+s.URL+" only", http.StatusBadRequest)
		return
	}
	code := random()
	s.mu.Lock()
	s.codes[code] = grant{client: q.Get("client_id"), redirect: redirect, challenge: q.Get("code_challenge")}
	s.mu.Unlock()
	back, _ := url.Parse(redirect)
	bq := back.Query()
	bq.Set("code", code)
	bq.Set("state", q.Get("state"))
	bq.Set("iss", s.Issuer)
	back.RawQuery = bq.Encode()
	http.Redirect(w, r, back.String(), http.StatusFound)
}

// token is the token endpoint: the authorization code grant (the code once,
// with its PKCE verifier) and the refresh token grant (rotating), each only
// for the server's own URL as the resource.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	if r.ParseForm() != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request"})
		return
	}
	f := r.PostForm
	if f.Get("resource") != s.URL {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_target"})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch f.Get("grant_type") {
	case "authorization_code":
		g, ok := s.codes[f.Get("code")]
		delete(s.codes, f.Get("code"))
		sum := sha256.Sum256([]byte(f.Get("code_verifier")))
		if !ok || g.client != f.Get("client_id") || g.redirect != f.Get("redirect_uri") ||
			base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant"})
			return
		}
	case "refresh_token":
		if !s.refresh[f.Get("refresh_token")] {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant"})
			return
		}
		delete(s.refresh, f.Get("refresh_token"))
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unsupported_grant_type"})
		return
	}
	s.issued++
	access, refresh := fmt.Sprintf("access-%d-%s", s.issued, random()), "refresh-"+random()
	s.access[access] = time.Now().Add(TokenTTL)
	s.refresh[refresh] = true
	writeJSON(w, http.StatusOK, map[string]any{"access_token": access, "token_type": "Bearer",
		"expires_in": int(TokenTTL / time.Second), "refresh_token": refresh, "scope": "mcp offline_access"})
}

// Browse plays the user's browser at authURL: the authorization server
// approves, and the browser follows its redirect to the client's redirect
// URI. It returns the status of that last answer.
func Browse(ctx context.Context, authURL string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, authURL, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func random() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// statusWriter records the status an http.Handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
