package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// IBM ContextForge (PyPI mcp-contextforge-gateway, installed by
// bench/peers/contextforge.sh from its hashed lock) set up as its PyPI quick
// start does: the mcpgateway command (uvicorn, one worker), JWT_SECRET_KEY
// and AUTH_ENCRYPTION_SECRET, the three passwords its settings ask for, a
// SQLite database in its own directory, loopback upstreams allowed
// (SSRF_ALLOW_LOCALHOST), an upstream registered as a gateway with
// transport STREAMABLEHTTP, a virtual server holding its tools, and agents
// at /servers/<id>/mcp with a bearer JWT minted by its
// mcpgateway.utils.create_jwt_token module.

// contextForgeAdmin is the platform admin's e-mail, as in its quick start;
// the agents' bearer token names it.
const contextForgeAdmin = "admin@example.com"

// contextForge is a running ContextForge: its uvicorn process and the
// processes it forks.
type contextForge struct {
	root  *child
	venv  string
	dir   string
	base  string   // http://127.0.0.1:<port>
	env   []string // its settings, also for the token tool
	token string   // the bearer JWT agents and the harness send
	hc    *http.Client
}

// contextForgeEnv returns ContextForge's settings for a run in dir: fresh
// secrets and passwords (each at least 12 characters, with upper and lower
// case, a digit and a sign), the database in dir, loopback upstreams
// allowed, and the MCP tier's rate limit (RATE_LIMIT_MEDIUM_RPM, requests
// per minute per client IP and per user; 0 keeps its default of 100).
func contextForgeEnv(dir string, rpm int) []string {
	env := []string{
		"JWT_SECRET_KEY=" + randomSecret(48),
		"AUTH_ENCRYPTION_SECRET=" + randomSecret(48),
		"BASIC_AUTH_PASSWORD=" + randomPassword(),
		"PLATFORM_ADMIN_PASSWORD=" + randomPassword(),
		"DEFAULT_USER_PASSWORD=" + randomPassword(),
		"PLATFORM_ADMIN_EMAIL=" + contextForgeAdmin,
		"DATABASE_URL=sqlite:///" + filepath.Join(dir, "mcp.db"),
		"SSRF_ALLOW_LOCALHOST=true",
	}
	if rpm > 0 {
		env = append(env, "RATE_LIMIT_MEDIUM_RPM="+strconv.Itoa(rpm))
	}
	return env
}

// randomSecret returns n random bytes, base64url-encoded.
func randomSecret(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// randomPassword returns a 28-character password of the classes
// ContextForge's password policy asks for.
func randomPassword() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "Bench-" + hex.EncodeToString(b) + "!Q"
}

// startContextForge runs ContextForge from the venv on a free loopback
// port, in dir (its working directory: it reads no .env of the
// repository), and mints the agents' token. It returns when /health
// answers 200, bounded by two minutes (it migrates its database first).
func startContextForge(ctx context.Context, venv, dir string, rpm int) (*contextForge, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	host, port, _ := strings.Cut(addr, ":")
	cf := &contextForge{venv: venv, dir: dir, base: "http://" + addr, env: contextForgeEnv(dir, rpm),
		hc: &http.Client{Timeout: 60 * time.Second}}
	bin := filepath.Join(venv, "bin", "mcpgateway")
	cf.root, err = startChild(ctx, "contextforge", filepath.Join(dir, "contextforge.log"), false, cf.env,
		"env", "-C", dir, bin, "--host", host, "--port", port, "--workers", "1")
	if err != nil {
		return nil, err
	}
	if err := cf.waitHealthy(ctx, 2*time.Minute); err != nil {
		cf.stop()
		return nil, fmt.Errorf("contextforge (log %s): %w", filepath.Join(dir, "contextforge.log"), err)
	}
	if cf.token, err = cf.mintToken(ctx); err != nil {
		cf.stop()
		return nil, err
	}
	return cf, nil
}

// waitHealthy polls /health until it answers 200.
func (cf *contextForge) waitHealthy(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	hc := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := hc.Get(cf.base + "/health"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/health not 200 after %s", limit)
		}
		select {
		case <-cf.root.done:
			return errors.New("exited before it was healthy")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// mintToken runs `python -m mcpgateway.utils.create_jwt_token` as its
// quick start does: the admin's user name, a week's expiry, its secret.
func (cf *contextForge) mintToken(ctx context.Context) (string, error) {
	var secret string
	for _, kv := range cf.env {
		if v, ok := strings.CutPrefix(kv, "JWT_SECRET_KEY="); ok {
			secret = v
		}
	}
	cmd := exec.CommandContext(ctx, filepath.Join(cf.venv, "bin", "python"), "-m", "mcpgateway.utils.create_jwt_token",
		"--username", contextForgeAdmin, "--exp", "10080", "--secret", secret)
	cmd.Dir, cmd.Env = cf.dir, append(os.Environ(), cf.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("create_jwt_token: %w: %.300s", err, stderr.String())
	}
	lines := strings.Fields(string(out))
	if len(lines) == 0 {
		return "", fmt.Errorf("create_jwt_token printed no token: %.300s", stderr.String())
	}
	return lines[len(lines)-1], nil
}

// api sends one request to ContextForge's REST API with the admin token
// and decodes a 2xx answer into v.
func (cf *contextForge) api(ctx context.Context, method, path string, body, v any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, cf.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cf.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := cf.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: status %d: %.300s", method, path, resp.StatusCode, b)
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(b, v)
}

// cfServer is an upstream as ContextForge's agents reach it.
type cfServer struct {
	URL   string            // the virtual server's MCP endpoint
	Tools map[string]string // the upstream's tool name → ContextForge's name for it
}

// register registers upstream URL upURL as gateway name (transport
// STREAMABLEHTTP) and makes a virtual server of its tools.
func (cf *contextForge) register(ctx context.Context, name, upURL string) (cfServer, error) {
	var gw struct {
		ID string `json:"id"`
	}
	if err := cf.api(ctx, http.MethodPost, "/gateways",
		map[string]string{"name": name, "url": upURL, "transport": "STREAMABLEHTTP"}, &gw); err != nil {
		return cfServer{}, err
	}
	var tools []struct {
		ID           string `json:"id"`
		Name         string `json:"name"`
		OriginalName string `json:"originalName"`
		GatewayID    string `json:"gatewayId"`
	}
	if err := cf.api(ctx, http.MethodGet, "/tools", nil, &tools); err != nil {
		return cfServer{}, err
	}
	srv := cfServer{Tools: map[string]string{}}
	var ids []string
	for _, t := range tools {
		if t.GatewayID == gw.ID {
			srv.Tools[t.OriginalName] = t.Name
			ids = append(ids, t.ID)
		}
	}
	if len(ids) == 0 {
		return cfServer{}, fmt.Errorf("gateway %s (%s): no tools listed", name, upURL)
	}
	var vs struct {
		ID string `json:"id"`
	}
	if err := cf.api(ctx, http.MethodPost, "/servers", map[string]any{"server": map[string]any{
		"name": name, "description": "mcpbench upstream " + name, "associated_tools": ids}}, &vs); err != nil {
		return cfServer{}, err
	}
	srv.URL = cf.base + "/servers/" + vs.ID + "/mcp"
	return srv, nil
}

// version returns ContextForge's version as its package reports it.
func (cf *contextForge) version(ctx context.Context) string {
	cmd := exec.CommandContext(ctx, filepath.Join(cf.venv, "bin", "mcpgateway"), "--version")
	cmd.Dir, cmd.Env = cf.dir, append(os.Environ(), cf.env...)
	out, err := cmd.Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return "?"
	}
	return f[len(f)-1]
}

// stop ends ContextForge (SIGTERM: uvicorn's graceful shutdown), then
// kills what is left of the processes it had forked.
func (cf *contextForge) stop() {
	if cf == nil || cf.root == nil {
		return
	}
	type proc struct {
		pid   int
		start uint64
	}
	var forked []proc
	for _, pid := range treePids(cf.root.pid())[1:] {
		if st, err := readProcStat(pid); err == nil {
			forked = append(forked, proc{pid, st.start})
		}
	}
	cf.root.stop(10 * time.Second)
	for _, p := range forked {
		// Only the same process: its pid with the start time it had.
		if st, err := readProcStat(p.pid); err == nil && st.start == p.start {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}
