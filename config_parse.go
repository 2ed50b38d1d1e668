package main

// The config file walker: every key is checked against the schema with its
// line, so that each mistake reads "file:line: key: problem".

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"
)

// parser walks the YAML tree and collects every problem it finds.
type parser struct {
	file   string
	lookup func(string) (string, bool)
	errs   []error
}

func (p *parser) errorf(n *yaml.Node, key, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s:%d: %s: %s", p.file, n.Line, key, fmt.Sprintf(format, args...)))
}

// mapping calls fn for each key of a mapping node, rejecting duplicates and
// keys not in known. path prefixes keys in messages.
func (p *parser) mapping(n *yaml.Node, path string, known []string, fn func(key string, k, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		if n.Tag == "!!null" {
			return // "key:" with nothing after it: an empty map
		}
		p.errorf(n, strings.TrimSuffix(path, "."), "want a map, got %s", kindName(n))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		if line, dup := seen[key]; dup {
			p.errorf(k, path+key, "defined twice (first at line %d)", line)
			continue
		}
		seen[key] = k.Line
		if known != nil && !slices.Contains(known, key) {
			p.errorf(k, path+key, "unknown key%s (known here: %s)", suggest(key, known), strings.Join(known, ", "))
			continue
		}
		fn(key, k, v)
	}
}

// suggest returns ", did you mean X?" for the known key closest to key
// (at most two edits away), or "".
func suggest(key string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(", did you mean %s?", best)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

var (
	topKeys = []string{"listen", "admin_listen", "insecure_listen", "auth_tokens", "log", "allow_hosts", "defaults", "upstreams",
		"session_store", "redis", "tracing"}
	logKeys     = []string{"level", "format"}
	settingKeys = []string{"heal_timeout", "response_timeout", "session_ttl", "max_idle_conn", "keepalive",
		"stream_keepalive", "read_timeout", "max_sessions", "max_body", "max_streams",
		"max_sessions_per_credential", "max_header_bytes", "max_json_depth", "max_init_body", "max_answer",
		"max_sse_line", "write_timeout", "memory_budget", "max_journal", "resume_buffer", "resume_window", "session_keys", "session_max_age", "era_bridge"}
	upstreamKeys = append([]string{"url", "path", "headers", "credentials", "auth_tokens", "replay_tools"}, settingKeys...)
	credKeys     = []string{"header", "value", "oauth"}
	oauthKeys    = []string{"token_url", "client_id", "client_secret", "refresh_token", "scopes", "token_file"}
	nameRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
)

func (p *parser) top(n *yaml.Node, f *fileConfig) {
	var admin *yaml.Node
	p.mapping(n, "", topKeys, func(key string, _, v *yaml.Node) {
		switch key {
		case "listen":
			f.Listen = p.str(v, key)
			if _, _, err := net.SplitHostPort(f.Listen); err != nil {
				p.errorf(v, key, "want host:port, got %q", f.Listen)
			}
		case "admin_listen":
			admin, f.AdminListen = v, p.adminListen(v, key)
		case "insecure_listen":
			f.InsecureListen = p.boolean(v, key)
		case "auth_tokens":
			f.AuthTokens = p.authTokens(v, key)
		case "log":
			p.mapping(v, "log.", logKeys, func(k string, _, lv *yaml.Node) {
				p.logKey(k, lv, f)
			})
		case "allow_hosts":
			f.AllowHosts = p.strs(v, key)
		case "defaults":
			p.mapping(v, "defaults.", settingKeys, func(k string, _, sv *yaml.Node) {
				p.setting(&f.Defaults, "defaults."+k, k, sv)
			})
		case "upstreams":
			p.mapping(v, "upstreams.", nil, func(name string, k, uv *yaml.Node) {
				f.Upstreams = append(f.Upstreams, p.upstream(name, k, uv))
			})
		case "session_store":
			p.sessionStore(v, f)
		case "redis":
			p.redis(v, f)
		case "tracing":
			p.tracing(v, f)
		}
	})
	if admin != nil && f.AdminListen == f.Listen {
		p.errorf(admin, "admin_listen", "%s is also listen: give operations their own port", f.Listen)
	}
}

// adminListen reads admin_listen: host:port, or "off" (or empty) to serve no
// operations endpoints.
func (p *parser) adminListen(v *yaml.Node, key string) string {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return "off"
	}
	s := p.str(v, key)
	if s == "" || s == "off" {
		return "off"
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		p.errorf(v, key, "want host:port, or off, got %q", s)
	}
	return s
}

func (p *parser) logKey(k string, v *yaml.Node, f *fileConfig) {
	s := p.str(v, "log."+k)
	switch k {
	case "level":
		if _, err := zerolog.ParseLevel(s); err != nil || s == "" {
			p.errorf(v, "log.level", "want debug, info, warn or error, got %q", s)
		}
		f.LogLevel = s
	case "format":
		if s != "json" && s != "console" && s != "auto" {
			p.errorf(v, "log.format", "want json, console or auto, got %q", s)
		}
		f.LogFormat = s
	}
}

func (p *parser) upstream(name string, k, n *yaml.Node) upstreamConfig {
	path := "upstreams." + name
	u := upstreamConfig{Name: name, Path: "/" + name + "/mcp", line: k.Line, pathLine: k.Line}
	hasURL := false
	if !nameRE.MatchString(name) {
		p.errorf(k, path, "name must be letters, digits, '.', '_' or '-' (it is part of the URL path)")
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "want a map with at least url, got %s", kindName(n))
		return u
	}
	p.mapping(n, path+".", upstreamKeys, func(key string, _, v *yaml.Node) {
		kp := path + "." + key
		switch key {
		case "url":
			hasURL = true
			u.URL = p.upstreamURL(v, kp)
		case "path":
			u.Path, u.pathLine = p.str(v, kp), v.Line
			if !strings.HasPrefix(u.Path, "/") {
				p.errorf(v, kp, "must start with /, got %q", u.Path)
			}
		case "headers":
			u.Headers = p.headers(v, kp)
		case "credentials":
			u.Credentials = p.credentials(v, kp)
		case "auth_tokens":
			u.AuthTokens = p.authTokens(v, kp)
			if u.AuthTokens == nil {
				u.AuthTokens = []string{} // set, and empty: no inbound auth here
			}
		case "replay_tools":
			u.ReplayTools = p.strs(v, kp)
		default:
			p.setting(&u.settings, kp, key, v)
		}
	})
	if !hasURL {
		p.errorf(k, path+".url", "required: the MCP server's endpoint, e.g. https://mcp.example.com/mcp")
	}
	return u
}

// upstreamURL expands references in an upstream URL and checks it. A
// password in the URL must come from a reference.
func (p *parser) upstreamURL(v *yaml.Node, key string) string {
	raw := p.str(v, key)
	s := p.expand(v, key, raw)
	u, err := url.Parse(s)
	switch {
	case err != nil:
		p.errorf(v, key, "not a URL: %v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		p.errorf(v, key, "want an http:// or https:// URL, got %q", raw)
	case u.Host == "":
		p.errorf(v, key, "URL has no host: %q", raw)
	default:
		if _, hasPw := u.User.Password(); hasPw && !strings.Contains(raw, "${") {
			p.errorf(v, key, "literal password in the URL: use a ${ENV} reference")
		}
	}
	return s
}

// credentialHeader names headers that carry secrets: their value must come
// from an ${ENV} reference so that the file itself holds no secret.
func credentialHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie":
		return true
	}
	return strings.Contains(n, "token") || strings.Contains(n, "secret") ||
		strings.Contains(n, "key") || strings.Contains(n, "password")
}

func (p *parser) headers(n *yaml.Node, path string) map[string]string {
	h := map[string]string{}
	p.mapping(n, path+".", nil, func(name string, k, v *yaml.Node) {
		kp := path + "." + name
		if name == "" || strings.ContainsAny(name, " :\t\r\n") {
			p.errorf(k, kp, "not a valid header name")
			return
		}
		raw := p.str(v, kp)
		if credentialHeader(name) && !strings.Contains(raw, "${") {
			p.errorf(v, kp, "credentials must come from an ${ENV} reference (e.g. \"Bearer ${TOKEN}\"), not a literal")
			return
		}
		h[name] = p.expand(v, kp, raw)
	})
	return h
}

// setting parses one of settingKeys into s.
func (p *parser) setting(s *settings, path, key string, v *yaml.Node) {
	switch key {
	case "heal_timeout":
		s.HealTimeout = p.duration(v, path, false)
	case "response_timeout":
		s.ResponseTimeout = p.duration(v, path, false)
	case "session_ttl":
		s.SessionTTL = p.duration(v, path, false)
	case "max_idle_conn":
		s.MaxIdleConn = p.duration(v, path, false)
	case "keepalive":
		s.Keepalive = p.duration(v, path, true)
	case "stream_keepalive":
		s.StreamKeepalive = p.duration(v, path, false)
	case "read_timeout":
		s.ReadTimeout = p.duration(v, path, false)
	case "max_sessions":
		s.MaxSessions = p.positive(v, path)
	case "max_body":
		s.MaxBody = p.positive(v, path)
	case "max_streams":
		s.MaxStreams = p.positive(v, path)
	case "max_sessions_per_credential":
		s.MaxSessionsPerCredential = p.positive(v, path)
	case "max_header_bytes":
		s.MaxHeaderBytes = p.positive(v, path)
	case "max_json_depth":
		s.MaxJSONDepth = p.positive(v, path)
	case "max_init_body":
		s.MaxInitBody = p.positive(v, path)
	case "session_keys":
		s.SessionKeys = p.secret(v, path, `"1:${MCPHEAL_SESSION_KEY}"`)
	case "session_max_age":
		s.SessionMaxAge = p.duration(v, path, false)
	case "memory_budget":
		s.MemoryBudget = p.positive(v, path)
	case "max_journal":
		s.MaxJournal = p.positive(v, path)
	case "resume_buffer":
		s.ResumeBuffer = p.positive(v, path)
	case "resume_window":
		s.ResumeWindow = p.duration(v, path, true)
	case "max_answer":
		s.MaxAnswer = p.positive(v, path)
	case "max_sse_line":
		s.MaxSSELine = p.positive(v, path)
	case "write_timeout":
		s.WriteTimeout = p.duration(v, path, false)
	case "era_bridge":
		switch s.EraBridge = p.str(v, path); s.EraBridge {
		case "auto", "off", "legacy-agents", "2026-agents", "prefer-2026":
		default:
			p.errorf(v, path, "want auto, legacy-agents, 2026-agents, prefer-2026 or off, got %q", s.EraBridge)
		}
	}
}

// duration parses a Go duration with a unit ("15s", "2m30s"). A bare number
// is rejected: "15" could mean seconds or nanoseconds. With offOK, "off" and
// zero mean disabled (returned as -1).
func (p *parser) duration(v *yaml.Node, key string, offOK bool) time.Duration {
	s := p.str(v, key)
	if offOK && (s == "off" || s == "0") {
		return -1
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		hint := ""
		if _, nerr := strconv.Atoi(s); nerr == nil {
			hint = fmt.Sprintf(" (a unit is required: %ss or %sms)", s, s)
		}
		p.errorf(v, key, "bad duration %q%s", s, hint)
	case d == 0 && offOK:
		return -1
	case d <= 0:
		p.errorf(v, key, "must be positive, got %q", s)
	}
	return d
}

func (p *parser) positive(v *yaml.Node, key string) int {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		p.errorf(v, key, "want a whole number, got %s %q", kindName(v), v.Value)
		return 0
	}
	n, err := strconv.Atoi(v.Value)
	if err != nil || n <= 0 {
		p.errorf(v, key, "want a positive whole number, got %q", v.Value)
		return 0
	}
	return n
}

func (p *parser) boolean(v *yaml.Node, key string) bool {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
		p.errorf(v, key, "want true or false, got %s %q", kindName(v), v.Value)
		return false
	}
	return v.Value == "true" || v.Value == "True" || v.Value == "TRUE"
}

// secret expands a value that must come from ${ENV} references.
func (p *parser) secret(v *yaml.Node, key, example string) string {
	raw := p.str(v, key)
	if raw != "" && !strings.Contains(raw, "${") {
		p.errorf(v, key, "secrets must come from an ${ENV} reference (e.g. %s), not a literal", example)
		return ""
	}
	return p.expand(v, key, raw)
}

// authTokens reads the bearer tokens agents must present (each from an
// ${ENV} reference, at least 16 characters).
func (p *parser) authTokens(v *yaml.Node, key string) []string {
	var out []string
	list := []*yaml.Node{v}
	if v.Kind == yaml.SequenceNode {
		list = v.Content
	} else if v.Tag == "!!null" {
		return nil
	}
	for _, e := range list {
		t := p.secret(e, key, `"${MCPHEAL_TOKEN}"`)
		if t == "" {
			continue
		}
		if len(t) < 16 {
			p.errorf(e, key, "an inbound auth token must be at least 16 characters (its variable holds %d)", len(t))
			continue
		}
		out = append(out, t)
	}
	return out
}

// str returns a scalar's text; a sequence or map is an error.
func (p *parser) str(v *yaml.Node, key string) string {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		p.errorf(v, key, "want a single value, got %s", kindName(v))
		return ""
	}
	return v.Value
}

// strs accepts a sequence of scalars (or one scalar).
func (p *parser) strs(v *yaml.Node, key string) []string {
	if v.Kind == yaml.ScalarNode && v.Tag != "!!null" {
		return []string{v.Value}
	}
	if v.Kind != yaml.SequenceNode {
		if v.Tag == "!!null" {
			return nil
		}
		p.errorf(v, key, "want a list, got %s", kindName(v))
		return nil
	}
	var out []string
	for _, e := range v.Content {
		out = append(out, p.str(e, key))
	}
	return out
}

func kindName(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a map"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Tag == "!!null":
		return "nothing"
	case n.Kind == yaml.AliasNode:
		return "an alias"
	}
	return strings.TrimPrefix(n.Tag, "!!")
}

// refRE matches ${NAME}; "$${" is a literal "${".
var refRE = regexp.MustCompile(`\$\$\{|\$\{([^}]*)\}`)

// expand replaces ${NAME} with the variable's value. An undefined variable
// or a malformed reference is an error naming the key.
func (p *parser) expand(v *yaml.Node, key, s string) string {
	out := refRE.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$${" {
			return "${"
		}
		name := m[2 : len(m)-1]
		if !envNameRE.MatchString(name) {
			p.errorf(v, key, "bad reference %q: want ${NAME} with letters, digits and _", m)
			return ""
		}
		val, ok := p.lookup(name)
		if !ok {
			p.errorf(v, key, "environment variable %s is not set", name)
			return ""
		}
		return val
	})
	if strings.Contains(refRE.ReplaceAllString(s, ""), "${") {
		p.errorf(v, key, "unterminated ${ reference")
	}
	return out
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
