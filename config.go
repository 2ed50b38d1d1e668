package main

// The config file (docs/configuration.md "Configuration file"): YAML, one listener, global defaults and a
// map of upstreams. Every mistake is reported as "file:line: key: problem",
// all of them at once, before anything starts; config.example.yaml documents
// every key.

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/proxy/telemetry"
	"github.com/mcpheal/mcpheal/upstream"
)

// settings are the per-upstream knobs that also have a global default.
// A zero field is unset; Keepalive < 0 means disabled.
type settings struct {
	HealTimeout              time.Duration
	ResponseTimeout          time.Duration
	SessionTTL               time.Duration
	MaxIdleConn              time.Duration
	Keepalive                time.Duration
	StreamKeepalive          time.Duration
	ReadTimeout              time.Duration
	MaxSessions              int
	MaxBody                  int
	MaxStreams               int
	MaxSessionsPerCredential int
	MaxHeaderBytes           int
	MaxJSONDepth             int
	MaxInitBody              int
	MaxAnswer                int
	MaxSSELine               int
	MemoryBudget             int
	MaxJournal               int
	ResumeBuffer             int
	ResumeWindow             time.Duration
	SessionKeys              string
	SessionMaxAge            time.Duration
	WriteTimeout             time.Duration
	EraBridge                string // "auto" or "off"
}

// builtin holds the defaults used when neither flags nor file set a value:
// proxy.Config's zero-value defaults, taken from the proxy itself (the
// session store's and upstream client's, which it does not define, aside).
var builtin = func() settings {
	d := proxy.Defaults()
	return settings{
		HealTimeout:              d.HealTimeout,
		ResponseTimeout:          d.ResponseTimeout,
		SessionTTL:               24 * time.Hour,
		MaxIdleConn:              30 * time.Second,
		Keepalive:                d.Keepalive,
		StreamKeepalive:          d.StreamKeepalive,
		ReadTimeout:              d.ReadTimeout,
		MaxSessions:              100_000,
		MaxBody:                  d.MaxBody,
		MaxStreams:               d.MaxStreams,
		MaxSessionsPerCredential: d.MaxSessionsPerCredential,
		MaxHeaderBytes:           d.MaxHeaderBytes,
		MaxJSONDepth:             d.MaxJSONDepth,
		MaxInitBody:              d.MaxInitBody,
		MaxAnswer:                d.MaxAnswer,
		MaxSSELine:               d.MaxSSELine,
		MemoryBudget:             d.MemoryBudget,
		MaxJournal:               d.MaxJournal,
		ResumeBuffer:             d.ResumeBuffer,
		ResumeWindow:             d.ResumeWindow,
		SessionMaxAge:            d.SessionMaxAge,
		WriteTimeout:             d.WriteTimeout,
		EraBridge:                d.EraBridge,
	}
}()

// or returns s with each unset field taken from base.
func (s settings) or(base settings) settings {
	pick := func(a, b time.Duration) time.Duration {
		if a != 0 {
			return a
		}
		return b
	}
	pickInt := func(a, b int) int {
		if a != 0 {
			return a
		}
		return b
	}
	pickStr := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	return settings{
		HealTimeout:              pick(s.HealTimeout, base.HealTimeout),
		ResponseTimeout:          pick(s.ResponseTimeout, base.ResponseTimeout),
		SessionTTL:               pick(s.SessionTTL, base.SessionTTL),
		MaxIdleConn:              pick(s.MaxIdleConn, base.MaxIdleConn),
		Keepalive:                pick(s.Keepalive, base.Keepalive),
		StreamKeepalive:          pick(s.StreamKeepalive, base.StreamKeepalive),
		ReadTimeout:              pick(s.ReadTimeout, base.ReadTimeout),
		MaxSessions:              pickInt(s.MaxSessions, base.MaxSessions),
		MaxBody:                  pickInt(s.MaxBody, base.MaxBody),
		MaxStreams:               pickInt(s.MaxStreams, base.MaxStreams),
		MaxSessionsPerCredential: pickInt(s.MaxSessionsPerCredential, base.MaxSessionsPerCredential),
		MaxHeaderBytes:           pickInt(s.MaxHeaderBytes, base.MaxHeaderBytes),
		MaxJSONDepth:             pickInt(s.MaxJSONDepth, base.MaxJSONDepth),
		MaxInitBody:              pickInt(s.MaxInitBody, base.MaxInitBody),
		MaxAnswer:                pickInt(s.MaxAnswer, base.MaxAnswer),
		MaxSSELine:               pickInt(s.MaxSSELine, base.MaxSSELine),
		MemoryBudget:             pickInt(s.MemoryBudget, base.MemoryBudget),
		MaxJournal:               pickInt(s.MaxJournal, base.MaxJournal),
		ResumeBuffer:             pickInt(s.ResumeBuffer, base.ResumeBuffer),
		ResumeWindow:             pick(s.ResumeWindow, base.ResumeWindow),
		SessionKeys:              pickStr(s.SessionKeys, base.SessionKeys),
		SessionMaxAge:            pick(s.SessionMaxAge, base.SessionMaxAge),
		WriteTimeout:             pick(s.WriteTimeout, base.WriteTimeout),
		EraBridge:                pickStr(s.EraBridge, base.EraBridge),
	}
}

// upstreamConfig is one entry of the upstreams map.
type upstreamConfig struct {
	Name        string
	URL         string
	Path        string // "/<name>/mcp" unless set
	Headers     map[string]string
	ReplayTools []string
	// AuthTokens replace the file's top-level auth_tokens for this upstream
	// when set (nil: inherit).
	AuthTokens []string
	// Credentials is the upstream credential the proxy owns, or nil.
	Credentials *credSpec
	settings
	line     int // of the entry's key, for messages found after parsing
	pathLine int // of the path value, or line when path is not set
}

// fileConfig is a parsed, validated config file.
type fileConfig struct {
	File           string
	Listen         string
	AdminListen    string // "" unset (the default), "off" disabled
	InsecureListen bool
	AuthTokens     []string // inbound bearer tokens, for every upstream
	LogLevel       string
	LogFormat      string
	AllowHosts     []string
	Defaults       settings
	Upstreams      []upstreamConfig // in file order
	Store          storeSpec        // session_store, redis
	Tracing        telemetry.Config // tracing
}

// proxyConfigs maps the file onto one proxy.Config per upstream: builtin
// defaults, then the file's defaults, then the upstream's own values. creds
// turns a credentials entry into the object the proxy uses (see credCache).
func (f *fileConfig) proxyConfigs(creds func(*credSpec) upstream.Credentials) []proxy.Config {
	out := make([]proxy.Config, 0, len(f.Upstreams))
	for _, u := range f.Upstreams {
		s := u.settings.or(f.Defaults).or(builtin)
		tokens := f.AuthTokens
		if u.AuthTokens != nil {
			tokens = u.AuthTokens
		}
		c := proxy.Config{
			Name:                     u.Name,
			Upstream:                 u.URL,
			Headers:                  u.Headers,
			Keepalive:                s.Keepalive,
			StreamKeepalive:          s.StreamKeepalive,
			Listen:                   f.Listen,
			AdminListen:              f.AdminListen,
			Path:                     u.Path,
			AllowedHosts:             slices.Clone(f.AllowHosts),
			MaxBody:                  s.MaxBody,
			HealTimeout:              s.HealTimeout,
			ResponseTimeout:          s.ResponseTimeout,
			SessionTTL:               s.SessionTTL,
			MaxSessions:              s.MaxSessions,
			MaxIdleConn:              s.MaxIdleConn,
			ReplayTools:              slices.Clone(u.ReplayTools),
			AuthTokens:               slices.Clone(tokens),
			InsecureListen:           f.InsecureListen,
			MaxStreams:               s.MaxStreams,
			MaxSessionsPerCredential: s.MaxSessionsPerCredential,
			ReadTimeout:              s.ReadTimeout,
			MaxHeaderBytes:           s.MaxHeaderBytes,
			MaxJSONDepth:             s.MaxJSONDepth,
			MaxInitBody:              s.MaxInitBody,
			MaxAnswer:                s.MaxAnswer,
			MaxSSELine:               s.MaxSSELine,
			MemoryBudget:             s.MemoryBudget,
			MaxJournal:               s.MaxJournal,
			ResumeBuffer:             s.ResumeBuffer,
			ResumeWindow:             s.ResumeWindow,
			SessionKeys:              cmp.Or(s.SessionKeys, os.Getenv("MCPHEAL_SESSION_KEYS")),
			SessionMaxAge:            s.SessionMaxAge,
			WriteTimeout:             s.WriteTimeout,
			EraBridge:                s.EraBridge,
		}
		if u.Credentials != nil && creds != nil {
			c.Credentials = creds(u.Credentials)
		}
		out = append(out, c)
	}
	return out
}

// loadConfig reads and validates a config file. lookup resolves ${NAME}
// references (os.LookupEnv outside tests).
func loadConfig(path string, lookup func(string) (string, bool)) (*fileConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parseConfig(path, data, lookup)
}

// parseConfig validates data, the contents of file.
func parseConfig(file string, data []byte, lookup func(string) (string, bool)) (*fileConfig, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	p := &parser{file: file, lookup: lookup}
	f := &fileConfig{File: file, Listen: "127.0.0.1:8787"}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("%s: empty config: it needs at least an upstreams map", file)
	}
	p.top(doc.Content[0], f)
	p.crossCheck(doc.Content[0], f)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	// Belt and braces: the strict decoder must agree that every key is known.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var shadow fileShadow
	if err := dec.Decode(&shadow); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return f, nil
}

// crossCheck validates what involves several keys: at least one upstream,
// and distinct paths that do not hide the operations endpoints.
func (p *parser) crossCheck(root *yaml.Node, f *fileConfig) {
	p.checkStore(root, f)
	if len(f.Upstreams) == 0 {
		p.errorf(root, "upstreams", "no upstream configured: add at least one, e.g. upstreams: {myserver: {url: http://127.0.0.1:3000/mcp}}")
		return
	}
	byPath := map[string]upstreamConfig{}
	for _, u := range f.Upstreams {
		node := &yaml.Node{Line: u.pathLine}
		switch u.Path {
		case "/healthz", "/readyz", "/metrics":
			p.errorf(node, "upstreams."+u.Name+".path", "%s is reserved for operations", u.Path)
		}
		if prev, dup := byPath[u.Path]; dup {
			p.errorf(node, "upstreams."+u.Name+".path", "%s is already the path of upstream %q (line %d)", u.Path, prev.Name, prev.line)
			continue
		}
		byPath[u.Path] = u
	}
}

// fileShadow mirrors the schema for the strict (KnownFields) decoder.
type fileShadow struct {
	Listen         string            `yaml:"listen"`
	AdminListen    string            `yaml:"admin_listen"`
	InsecureListen bool              `yaml:"insecure_listen"`
	AuthTokens     any               `yaml:"auth_tokens"`
	Log            map[string]string `yaml:"log"`
	AllowHosts     any               `yaml:"allow_hosts"`
	Defaults       shadowSettings    `yaml:"defaults"`
	SessionStore   string            `yaml:"session_store"`
	Tracing        struct {
		Endpoint    string            `yaml:"endpoint"`
		Headers     map[string]string `yaml:"headers"`
		ServiceName string            `yaml:"service_name"`
		Sampler     string            `yaml:"sampler"`
		SamplerArg  string            `yaml:"sampler_arg"`
	} `yaml:"tracing"`
	Redis struct {
		Addr     string `yaml:"addr"`
		Username string `yaml:"username"`
		Password string `yaml:"password"`
		DB       int    `yaml:"db"`
		TLS      bool   `yaml:"tls"`
		Timeout  string `yaml:"timeout"`
	} `yaml:"redis"`
	Upstreams map[string]struct {
		URL         string            `yaml:"url"`
		Path        string            `yaml:"path"`
		Headers     map[string]string `yaml:"headers"`
		AuthTokens  any               `yaml:"auth_tokens"`
		ReplayTools any               `yaml:"replay_tools"`
		Credentials struct {
			Header string `yaml:"header"`
			Value  string `yaml:"value"`
			OAuth  struct {
				TokenURL     string `yaml:"token_url"`
				ClientID     string `yaml:"client_id"`
				ClientSecret string `yaml:"client_secret"`
				RefreshToken string `yaml:"refresh_token"`
				Scopes       any    `yaml:"scopes"`
				TokenFile    string `yaml:"token_file"`
			} `yaml:"oauth"`
		} `yaml:"credentials"`
		shadowSettings `yaml:",inline"`
	} `yaml:"upstreams"`
}

type shadowSettings struct {
	HealTimeout              string `yaml:"heal_timeout"`
	ResponseTimeout          string `yaml:"response_timeout"`
	SessionTTL               string `yaml:"session_ttl"`
	MaxIdleConn              string `yaml:"max_idle_conn"`
	Keepalive                string `yaml:"keepalive"`
	StreamKeepalive          string `yaml:"stream_keepalive"`
	ReadTimeout              string `yaml:"read_timeout"`
	MaxSessions              int    `yaml:"max_sessions"`
	MaxBody                  int    `yaml:"max_body"`
	MaxStreams               int    `yaml:"max_streams"`
	MaxSessionsPerCredential int    `yaml:"max_sessions_per_credential"`
	MaxHeaderBytes           int    `yaml:"max_header_bytes"`
	MaxJSONDepth             int    `yaml:"max_json_depth"`
	MaxInitBody              int    `yaml:"max_init_body"`
	MaxAnswer                int    `yaml:"max_answer"`
	MaxSSELine               int    `yaml:"max_sse_line"`
	MemoryBudget             int    `yaml:"memory_budget"`
	MaxJournal               int    `yaml:"max_journal"`
	ResumeBuffer             int    `yaml:"resume_buffer"`
	ResumeWindow             string `yaml:"resume_window"`
	SessionKeys              string `yaml:"session_keys"`
	SessionMaxAge            string `yaml:"session_max_age"`
	WriteTimeout             string `yaml:"write_timeout"`
	EraBridge                string `yaml:"era_bridge"`
}
