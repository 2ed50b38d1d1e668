package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mcpheal/mcpheal/proxy"
)

// env is a fixed environment for ${NAME} references.
func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

var testEnv = env(map[string]string{
	"WP_TOKEN": "s3cret", "EMPTY": "", "USER_PW": "pw", "SHORT": "abc",
	"MCPHEAL_TOKEN": "0123456789abcdef-inbound", "CRM_CLIENT_SECRET": "cs3cret", "API_TOKEN": "t0ken",
})

// TestParseConfigGood: a file using every kind of key maps onto the
// expected proxy.Config values: builtin defaults < file defaults < the
// upstream's own values; path defaults to /<name>/mcp; references expand.
func TestParseConfigGood(t *testing.T) {
	t.Parallel()
	const file = `
listen: 127.0.0.1:9000
admin_listen: 127.0.0.1:9001
insecure_listen: true
auth_tokens: ["${MCPHEAL_TOKEN}"]
log: {level: debug, format: json}
allow_hosts: [mcpheal.internal]
defaults:
  heal_timeout: 20s
  keepalive: off
  max_sessions: 50
  max_streams: 2
  max_json_depth: 16
  write_timeout: 10s
upstreams:
  wordpress:
    url: https://mcp.example.com/mcp?site=${EMPTY}x
    headers:
      Authorization: Bearer ${WP_TOKEN}
      X-Client: mcpheal $${literal}
    replay_tools: [search, fetch]
    heal_timeout: 3s
    keepalive: 90s
    credentials: {value: "Token ${API_TOKEN}"}
  local:
    url: http://user:${USER_PW}@127.0.0.1:3000/mcp
    path: /
    max_body: 1024
    auth_tokens: []
    read_timeout: 5s
    max_init_body: 2048
    max_answer: 1048576
    max_sse_line: 65536
    credentials:
      oauth: {token_url: "https://auth.example.com/token", client_id: me, client_secret: "${CRM_CLIENT_SECRET}", scopes: [a, b]}
`
	f, err := parseConfig("test.yaml", []byte(file), testEnv)
	if err != nil {
		t.Fatalf("parseConfig: %v", err)
	}
	if f.LogLevel != "debug" || f.LogFormat != "json" {
		t.Errorf("log = %q/%q, want debug/json", f.LogLevel, f.LogFormat)
	}
	base := proxy.Config{
		Listen: "127.0.0.1:9000", AllowedHosts: []string{"mcpheal.internal"}, InsecureListen: true,
		ResponseTimeout: builtin.ResponseTimeout, SessionTTL: builtin.SessionTTL, MaxIdleConn: builtin.MaxIdleConn,
		StreamKeepalive: builtin.StreamKeepalive, ReadTimeout: builtin.ReadTimeout, MaxSessions: 50, MaxStreams: 2,
		MaxSessionsPerCredential: builtin.MaxSessionsPerCredential, MaxHeaderBytes: builtin.MaxHeaderBytes,
		MaxBody: builtin.MaxBody, HealTimeout: 20 * time.Second, Keepalive: -1,
		AdminListen: "127.0.0.1:9001", MaxJSONDepth: 16, WriteTimeout: 10 * time.Second,
		MaxInitBody: builtin.MaxInitBody, MaxAnswer: builtin.MaxAnswer, MaxSSELine: builtin.MaxSSELine,
		MemoryBudget: builtin.MemoryBudget, MaxJournal: builtin.MaxJournal, SessionMaxAge: builtin.SessionMaxAge, EraBridge: "auto",
		ResumeBuffer: builtin.ResumeBuffer, ResumeWindow: builtin.ResumeWindow,
	}
	wp, local := base, base
	wp.Name, wp.Upstream, wp.Path = "wordpress", "https://mcp.example.com/mcp?site=x", "/wordpress/mcp"
	wp.Headers = map[string]string{"Authorization": "Bearer s3cret", "X-Client": "mcpheal ${literal}"}
	wp.Keepalive, wp.HealTimeout = 90*time.Second, 3*time.Second
	wp.ReplayTools = []string{"search", "fetch"}
	wp.AuthTokens = []string{"0123456789abcdef-inbound"}
	local.Name, local.Upstream, local.Path = "local", "http://user:pw@127.0.0.1:3000/mcp", "/"
	local.MaxBody, local.ReadTimeout, local.AuthTokens = 1024, 5*time.Second, []string{}
	local.MaxInitBody, local.MaxAnswer, local.MaxSSELine = 2048, 1<<20, 64<<10
	want := []proxy.Config{wp, local}
	got := f.proxyConfigs(nil)
	if len(got) != len(want) {
		t.Fatalf("%d upstreams, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("upstream %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	wantCreds := []*credSpec{
		{Header: "Authorization", Value: "Token t0ken"},
		{Header: "Authorization", OAuth: &oauthSpec{TokenURL: "https://auth.example.com/token", ClientID: "me",
			ClientSecret: "cs3cret", Scopes: []string{"a", "b"}}},
	}
	for i, w := range wantCreds {
		if !reflect.DeepEqual(f.Upstreams[i].Credentials, w) {
			t.Errorf("upstream %d credentials %+v, want %+v", i, f.Upstreams[i].Credentials, w)
		}
	}
	// Each upstream gets a Credentials object; the same entry gives the
	// same object (a reload keeps its token and leaves the upstream unchanged).
	cache := newCredCache()
	defer cache.Close()
	c1, c2 := f.proxyConfigs(cache.get), f.proxyConfigs(cache.get)
	if c1[0].Credentials == nil || c1[1].Credentials == nil || c1[0].Credentials == c1[1].Credentials {
		t.Errorf("credentials %v, %v: want two distinct objects", c1[0].Credentials, c1[1].Credentials)
	}
	if !reflect.DeepEqual(c1, c2) {
		t.Error("the same file gave different configs: a reload would rebuild unchanged upstreams")
	}
}

// TestParseConfigBad: each kind of bad file is rejected with a message that
// names the file, the line and the key.
func TestParseConfigBad(t *testing.T) {
	t.Parallel()
	up := "upstreams:\n  a:\n    url: http://127.0.0.1:1/mcp\n"
	cases := []struct {
		name, file string
		want       string // regexp
	}{
		{"unknown top key", "lisen: x\n" + up, `^bad.yaml:1: lisen: unknown key, did you mean listen\? \(known here: listen,`},
		{"unknown upstream key", up + "    heal_timout: 5s\n", `^bad.yaml:4: upstreams\.a\.heal_timout: unknown key, did you mean heal_timeout\?`},
		{"unknown defaults key", "defaults:\n  ttl: 5s\n" + up, `^bad.yaml:2: defaults\.ttl: unknown key`},
		{"unknown log key", "log:\n  colour: yes\n" + up, `^bad.yaml:2: log\.colour: unknown key`},
		{"duration without unit", up + "    heal_timeout: 15\n", `^bad.yaml:4: upstreams\.a\.heal_timeout: bad duration "15" \(a unit is required: 15s`},
		{"bad duration", "defaults:\n  session_ttl: forever\n" + up, `^bad.yaml:2: defaults\.session_ttl: bad duration "forever"`},
		{"negative duration", up + "    response_timeout: -1s\n", `^bad.yaml:4: upstreams\.a\.response_timeout: must be positive`},
		{"duplicate path", up + "  b:\n    url: http://127.0.0.1:2/mcp\n    path: /a/mcp\n",
			`^bad.yaml:6: upstreams\.b\.path: /a/mcp is already the path of upstream "a" \(line 2\)`},
		{"reserved path", up + "    path: /metrics\n", `^bad.yaml:4: upstreams\.a\.path: /metrics is reserved`},
		{"path without slash", up + "    path: mcp\n", `^bad.yaml:4: upstreams\.a\.path: must start with /`},
		{"undefined env", up + "    headers:\n      Authorization: Bearer ${NOPE}\n",
			`^bad.yaml:5: upstreams\.a\.headers\.Authorization: environment variable NOPE is not set`},
		{"malformed reference", "upstreams:\n  a:\n    url: http://127.0.0.1:1/${A-B}\n", `^bad.yaml:3: upstreams\.a\.url: bad reference "\$\{A-B\}"`},
		{"unterminated reference", up + "    headers:\n      X-Tenant: ${TENANT\n", `^bad.yaml:5: upstreams\.a\.headers\.X-Tenant: unterminated`},
		{"literal credential", up + "    headers:\n      Authorization: Bearer abc123\n",
			`^bad.yaml:5: upstreams\.a\.headers\.Authorization: credentials must come from an \$\{ENV\} reference`},
		{"literal api key", up + "    headers:\n      X-Api-Key: abc123\n", `^bad.yaml:5: upstreams\.a\.headers\.X-Api-Key: credentials must`},
		{"literal url password", "upstreams:\n  a:\n    url: http://u:pw@127.0.0.1:1/mcp\n", `^bad.yaml:3: upstreams\.a\.url: literal password`},
		{"missing url", "upstreams:\n  a:\n    path: /x\n", `^bad.yaml:2: upstreams\.a\.url: required`},
		{"bad url scheme", "upstreams:\n  a:\n    url: ftp://127.0.0.1/mcp\n", `^bad.yaml:3: upstreams\.a\.url: want an http:// or https:// URL`},
		{"bad name", "upstreams:\n  a/b:\n    url: http://127.0.0.1:1/mcp\n", `^bad.yaml:2: upstreams\.a/b: name must be`},
		{"duplicate key", up + "    url: http://127.0.0.1:2/mcp\n", `^bad.yaml:4: upstreams\.a\.url: defined twice \(first at line 3\)`},
		{"max_sessions not a number", up + "    max_sessions: lots\n", `^bad.yaml:4: upstreams\.a\.max_sessions: want a whole number`},
		{"max_body zero", up + "    max_body: 0\n", `^bad.yaml:4: upstreams\.a\.max_body: want a positive whole number`},
		{"bad listen", "listen: 8787\n" + up, `^bad.yaml:1: listen: want host:port`},
		{"bad admin_listen", "admin_listen: 8788\n" + up, `^bad.yaml:1: admin_listen: want host:port, or off`},
		{"admin_listen is listen", "listen: 127.0.0.1:9000\nadmin_listen: 127.0.0.1:9000\n" + up,
			`^bad.yaml:2: admin_listen: 127.0.0.1:9000 is also listen`},
		{"max_json_depth zero", up + "    max_json_depth: 0\n", `^bad.yaml:4: upstreams\.a\.max_json_depth: want a positive whole number`},
		{"max_init_body not a number", "defaults:\n  max_init_body: 64KiB\n" + up, `^bad.yaml:2: defaults\.max_init_body: want a whole number`},
		{"max_answer negative", up + "    max_answer: -1\n", `^bad.yaml:4: upstreams\.a\.max_answer: want a positive whole number`},
		{"max_sse_line list", up + "    max_sse_line: [1]\n", `^bad.yaml:4: upstreams\.a\.max_sse_line: want a whole number`},
		{"write_timeout without unit", up + "    write_timeout: 30\n", `^bad.yaml:4: upstreams\.a\.write_timeout: bad duration "30" \(a unit is required`},
		{"bad log level", "log: {level: loud}\n" + up, `^bad.yaml:1: log\.level: want debug, info, warn or error`},
		{"upstream not a map", "upstreams:\n  a: http://127.0.0.1:1/mcp\n", `^bad.yaml:2: upstreams\.a: want a map with at least url`},
		{"list instead of value", "listen: [a, b]\n" + up, `^bad.yaml:1: listen: want a single value, got a list`},
		{"no upstreams", "listen: 127.0.0.1:1\n", `^bad.yaml:1: upstreams: no upstream configured`},
		{"literal auth token", "auth_tokens: [abcdefghijklmnopqrstuvwxyz]\n" + up, `^bad.yaml:1: auth_tokens: secrets must come from an \$\{ENV\} reference`},
		{"short auth token", "auth_tokens: [\"${SHORT}\"]\n" + up, `^bad.yaml:1: auth_tokens: an inbound auth token must be at least 16 characters \(its variable holds 3\)`},
		{"insecure_listen not bool", "insecure_listen: maybe\n" + up, `^bad.yaml:1: insecure_listen: want true or false`},
		{"credentials literal", up + "    credentials: {value: Bearer abc}\n", `^bad.yaml:4: upstreams\.a\.credentials\.value: secrets must come from`},
		{"credentials empty", up + "    credentials: {header: X-Key}\n", `^bad.yaml:4: upstreams\.a\.credentials: needs value \(a static credential\) or oauth`},
		{"credentials both", up + "    credentials:\n      value: ${API_TOKEN}\n      oauth: {token_url: https://a.example/t, client_id: x}\n",
			`^bad.yaml:5: upstreams\.a\.credentials: set either header and value, or oauth, not both`},
		{"oauth literal secret", up + "    credentials:\n      oauth: {token_url: https://a.example/t, client_id: x, client_secret: hunter2}\n",
			`^bad.yaml:5: upstreams\.a\.credentials\.oauth\.client_secret: secrets must come from`},
		{"oauth no token_url", up + "    credentials:\n      oauth:\n        client_id: x\n", `^bad.yaml:6: upstreams\.a\.credentials\.oauth: needs token_url and client_id`},
		{"oauth unknown key", up + "    credentials:\n      oauth:\n        client: x\n", `^bad.yaml:6: upstreams\.a\.credentials\.oauth\.client: unknown key`},
		{"empty file", "", `^bad.yaml: empty config`},
		{"not YAML", "upstreams: [\n", `^bad.yaml: yaml: line \d+:`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseConfig("bad.yaml", []byte(tc.file), testEnv)
			if err == nil {
				t.Fatalf("parseConfig accepted:\n%s", tc.file)
			}
			if !regexp.MustCompile(tc.want).MatchString(err.Error()) {
				t.Errorf("parseConfig error:\n %s\nwant match for %s", err, tc.want)
			}
		})
	}
}

// TestParseConfigAllErrors: every problem of a file is reported at once, so
// an operator fixes them in one go.
func TestParseConfigAllErrors(t *testing.T) {
	t.Parallel()
	file := "listen: nope\nupstreams:\n  a:\n    url: http://127.0.0.1:1/mcp\n    keepalive: 5\n    extra: 1\n"
	_, err := parseConfig("f.yaml", []byte(file), testEnv)
	if err == nil {
		t.Fatal("accepted a bad file")
	}
	for _, want := range []string{"f.yaml:1: listen:", "f.yaml:5: upstreams.a.keepalive:", "f.yaml:6: upstreams.a.extra:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%s", want, err)
		}
	}
}

// TestConfigExample: config.example.yaml is valid and documents every key
// the parser knows.
func TestConfigExample(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parseConfig("config.example.yaml", data, testEnv)
	if err != nil {
		t.Fatalf("example does not parse: %v", err)
	}
	if len(f.Upstreams) != 3 {
		t.Errorf("example has %d upstreams, want 3", len(f.Upstreams))
	}
	// The example's defaults are the builtin ones.
	if f.Defaults != builtin {
		t.Errorf("example defaults %+v, want builtin %+v", f.Defaults, builtin)
	}
	keys := slices.Concat(topKeys, logKeys, settingKeys, upstreamKeys, credKeys, oauthKeys)
	for _, k := range keys {
		if !regexp.MustCompile(`\b` + k + `:`).Match(data) {
			t.Errorf("config.example.yaml does not document %q", k)
		}
	}
}

// TestResolveFlags: flags given on the command line override the file;
// flags left at their defaults do not.
func TestResolveFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	two := filepath.Join(dir, "two.yaml")
	one := filepath.Join(dir, "one.yaml")
	writeFile(t, two, "listen: 127.0.0.1:9000\ndefaults: {heal_timeout: 20s}\nupstreams:\n  a: {url: http://127.0.0.1:1/mcp, replay_tools: [x]}\n  b: {url: http://127.0.0.1:2/mcp, session_ttl: 1h}\n")
	writeFile(t, one, "upstreams:\n  a: {url: http://127.0.0.1:1/mcp}\n")

	o := parseFlags(t, "--config", two, "--listen", "127.0.0.1:7000", "--session-ttl", "5m", "--replay-tool", "y", "--keepalive", "0")
	rc, err := resolve(o, testEnv, newCredCache())
	if err != nil {
		t.Fatal(err)
	}
	if rc.listen != "127.0.0.1:7000" {
		t.Errorf("listen %q, want the flag's", rc.listen)
	}
	for _, c := range rc.ups {
		if c.SessionTTL != 5*time.Minute || c.HealTimeout != 20*time.Second || c.Keepalive != -1 || c.Listen != rc.listen {
			t.Errorf("%s: ttl %v heal %v keepalive %v listen %s; want flag 5m, file 20s, disabled, 127.0.0.1:7000",
				c.Name, c.SessionTTL, c.HealTimeout, c.Keepalive, c.Listen)
		}
	}
	if got := rc.ups[0].ReplayTools; !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("replay tools %q, want file's plus flag's", got)
	}

	if _, err := resolve(parseFlags(t, "--config", two, "--upstream", "http://127.0.0.1:3/mcp"), testEnv, newCredCache()); err == nil {
		t.Error("--upstream with a two-upstream file accepted")
	}
	rc, err = resolve(parseFlags(t, "--config", one, "--upstream", "http://127.0.0.1:3/mcp", "--path", "/mcp"), testEnv, newCredCache())
	if err != nil || rc.ups[0].Upstream != "http://127.0.0.1:3/mcp" || rc.ups[0].Path != "/mcp" {
		t.Errorf("--upstream/--path over a one-upstream file: %+v, %v", rc, err)
	}

	rc, err = resolve(parseFlags(t, "--upstream", "http://127.0.0.1:3/mcp"), testEnv, newCredCache())
	if err != nil {
		t.Fatal(err)
	}
	c := rc.ups[0]
	if len(rc.ups) != 1 || c.Name != "default" || c.Path != "/mcp" || rc.listen != "127.0.0.1:8787" ||
		c.HealTimeout != builtin.HealTimeout || c.Keepalive != builtin.Keepalive || c.MaxBody != builtin.MaxBody {
		t.Errorf("--upstream alone: %+v", rc)
	}
}

// TestResolveAdminAndLimits: the admin listen address and the body, answer
// and write limits come from flags or the file like the other settings;
// an empty --admin-listen turns the admin listener off; unset, each takes
// the proxy's own default.
func TestResolveAdminAndLimits(t *testing.T) {
	t.Parallel()
	d := proxy.Defaults()
	if d.AdminListen != "127.0.0.1:8788" || d.MaxJSONDepth != 64 || d.MaxInitBody != 64<<10 ||
		d.MaxAnswer != 32<<20 || d.MaxSSELine != 8<<20 || d.WriteTimeout != 30*time.Second {
		t.Errorf("proxy.Defaults() = %+v", d)
	}
	if builtin.MaxJSONDepth != d.MaxJSONDepth || builtin.WriteTimeout != d.WriteTimeout || builtin.MaxAnswer != d.MaxAnswer {
		t.Errorf("builtin %+v does not take the proxy's defaults", builtin)
	}
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	writeFile(t, cfg, "admin_listen: 127.0.0.1:9100\ndefaults: {max_answer: 1000, write_timeout: 3s}\n"+
		"upstreams:\n  a: {url: http://127.0.0.1:1/mcp, max_sse_line: 500}\n  b: {url: http://127.0.0.1:2/mcp}\n")
	cases := []struct {
		name  string
		args  []string
		admin string
		check func(c proxy.Config) bool
	}{
		// No admin address given: "" here, and the proxy derives it from the
		// listen address (proxy.AdminFor: 127.0.0.1:8788 for the default).
		{"upstream alone", []string{"--upstream", "http://127.0.0.1:1/mcp"}, "", func(c proxy.Config) bool {
			return c.AdminListen == "" && c.MaxJSONDepth == d.MaxJSONDepth && c.MaxInitBody == d.MaxInitBody &&
				c.MaxAnswer == d.MaxAnswer && c.MaxSSELine == d.MaxSSELine && c.WriteTimeout == d.WriteTimeout
		}},
		{"upstream, flags", []string{"--upstream", "http://127.0.0.1:1/mcp", "--admin-listen", "", "--max-json-depth", "8",
			"--max-init-body", "100", "--max-answer", "200", "--max-sse-line", "300", "--write-timeout", "4s"}, "off",
			func(c proxy.Config) bool {
				return c.AdminListen == "off" && c.MaxJSONDepth == 8 && c.MaxInitBody == 100 && c.MaxAnswer == 200 &&
					c.MaxSSELine == 300 && c.WriteTimeout == 4*time.Second
			}},
		{"file", []string{"--config", cfg}, "127.0.0.1:9100", func(c proxy.Config) bool {
			return c.AdminListen == "127.0.0.1:9100" && c.MaxAnswer == 1000 && c.WriteTimeout == 3*time.Second &&
				c.MaxJSONDepth == d.MaxJSONDepth && (c.Name == "a") == (c.MaxSSELine == 500)
		}},
		{"file, flags", []string{"--config", cfg, "--admin-listen", "off", "--max-answer", "7", "--write-timeout", "1s"}, "off",
			func(c proxy.Config) bool {
				return c.AdminListen == "off" && c.MaxAnswer == 7 && c.WriteTimeout == time.Second
			}},
	}
	for _, tc := range cases {
		rc, err := resolve(parseFlags(t, tc.args...), testEnv, newCredCache())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if rc.admin != tc.admin {
			t.Errorf("%s: admin %q, want %q", tc.name, rc.admin, tc.admin)
		}
		for _, c := range rc.ups {
			if !tc.check(c) {
				t.Errorf("%s: upstream %s: %+v", tc.name, c.Name, c)
			}
		}
	}
}

func parseFlags(t *testing.T, args ...string) *options {
	t.Helper()
	o := &options{}
	fs := newFlags(o, os.Stderr)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	o.set = map[string]bool{}
	for _, a := range args {
		if strings.HasPrefix(a, "--") {
			o.set[strings.TrimPrefix(a, "--")] = true
		}
	}
	return o
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestKubernetesExampleConfig: the config embedded in the Kubernetes sidecar
// example is valid.
func TestKubernetesExampleConfig(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("examples/kubernetes/sidecar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("no ConfigMap with mcpheal.yaml in the example: %v", err)
		}
		if cfg, ok := doc.Data["mcpheal.yaml"]; doc.Kind == "ConfigMap" && ok {
			f, err := parseConfig("sidecar.yaml#mcpheal.yaml", []byte(cfg), testEnv)
			if err != nil {
				t.Fatalf("example config: %v", err)
			}
			if f.Listen != "127.0.0.1:8787" || len(f.Upstreams) != 2 {
				t.Errorf("example config: listen %s, %d upstreams; want loopback and 2", f.Listen, len(f.Upstreams))
			}
			return
		}
	}
}

// TestResolveExposure: a listener other hosts can reach needs inbound auth
// on every upstream, or --insecure-listen; the refusal says how.
func TestResolveExposure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	writeFile(t, cfg, "upstreams:\n  a: {url: http://127.0.0.1:1/mcp}\n")
	cases := []struct {
		name string
		args []string
		ok   bool
	}{
		{"loopback", []string{"--upstream", "http://127.0.0.1:1/mcp"}, true},
		{"exposed", []string{"--upstream", "http://127.0.0.1:1/mcp", "--listen", "0.0.0.0:8787"}, false},
		{"exposed, insecure", []string{"--upstream", "http://127.0.0.1:1/mcp", "--listen", "0.0.0.0:8787", "--insecure-listen"}, true},
		{"exposed, token", []string{"--upstream", "http://127.0.0.1:1/mcp", "--listen", "0.0.0.0:8787", "--auth-token-env", "MCPHEAL_TOKEN"}, true},
		{"short token", []string{"--upstream", "http://127.0.0.1:1/mcp", "--auth-token-env", "SHORT"}, false},
		{"unset token", []string{"--upstream", "http://127.0.0.1:1/mcp", "--auth-token-env", "NOPE"}, false},
		{"file exposed", []string{"--config", cfg, "--listen", "[::]:8787"}, false},
		{"file exposed, token", []string{"--config", cfg, "--listen", "[::]:8787", "--auth-token-env", "MCPHEAL_TOKEN"}, true},
	}
	for _, tc := range cases {
		rc, err := resolve(parseFlags(t, tc.args...), testEnv, newCredCache())
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok=%v", tc.name, err, tc.ok)
		}
		if tc.name == "exposed" && (err == nil || !strings.Contains(err.Error(), "--insecure-listen")) {
			t.Errorf("%s: refusal %v does not say how to proceed", tc.name, err)
		}
		if tc.name == "file exposed, token" && err == nil && !slices.Equal(rc.ups[0].AuthTokens, []string{"0123456789abcdef-inbound"}) {
			t.Errorf("%s: tokens %q", tc.name, rc.ups[0].AuthTokens)
		}
	}
}

// TestParseTracing: the tracing section's keys, and a sampler no
// OpenTelemetry SDK knows refused with its line.
func TestParseTracing(t *testing.T) {
	t.Parallel()
	up := "upstreams:\n  a: {url: http://127.0.0.1:1/mcp}\n"
	f, err := parseConfig("t.yaml", []byte("tracing:\n  endpoint: http://collector:4318\n  service_name: edge\n"+
		"  sampler: parentbased_traceidratio\n  sampler_arg: \"0.25\"\n  headers: {X-Tenant: blue}\n"+up), testEnv)
	if err != nil {
		t.Fatal(err)
	}
	if tr := f.Tracing; tr.Endpoint != "http://collector:4318" || tr.ServiceName != "edge" || tr.Sampler != "parentbased_traceidratio" ||
		tr.SamplerArg != "0.25" || tr.Headers["X-Tenant"] != "blue" {
		t.Errorf("tracing = %+v", f.Tracing)
	}
	_, err = parseConfig("t.yaml", []byte("tracing:\n  sampler: sometimes\n"+up), testEnv)
	if err == nil || !strings.Contains(err.Error(), "t.yaml:2: tracing.sampler") {
		t.Errorf("a bad sampler: %v; want t.yaml:2: tracing.sampler", err)
	}
}
