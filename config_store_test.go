package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestSessionStoreConfig: session_store and redis map onto the store spec;
// flags override the file; the password comes from ${ENV} (file) or
// MCPHEAL_REDIS_PASSWORD (flags), never a literal.
func TestSessionStoreConfig(t *testing.T) {
	t.Parallel()
	up := "upstreams:\n  a: {url: http://127.0.0.1:1/mcp}\n"
	f, err := parseConfig("s.yaml", []byte("session_store: redis\nredis:\n  addr: valkey:6379\n"+
		"  password: ${API_TOKEN}\n  db: 2\n  tls: true\n  timeout: 100ms\n"+up), testEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := storeSpec{Kind: "redis", Addr: "valkey:6379", Password: "t0ken", DB: 2, TLS: true, Timeout: 100 * time.Millisecond}
	if f.Store != want {
		t.Fatalf("store %+v, want %+v", f.Store, want)
	}

	bad := []struct{ name, file, want string }{
		{"redis without addr", "session_store: redis\n" + up, `^bad.yaml:1: redis.addr: session_store: redis needs redis.addr`},
		{"literal password", "session_store: redis\nredis: {addr: r:6379, password: hunter2}\n" + up,
			`^bad.yaml:2: redis.password: secrets must come from an \$\{ENV\} reference`},
		{"unknown kind", "session_store: etcd\n" + up, `^bad.yaml:1: session_store: want memory or redis, got "etcd"`},
		{"bad addr", "session_store: redis\nredis: {addr: valkey}\n" + up, `^bad.yaml:2: redis.addr: want host:port`},
		{"redis without session_store", "redis: {addr: r:6379}\n" + up, `session_store: redis is set but session_store is not redis`},
		{"bad era_bridge", "defaults: {era_bridge: maybe}\n" + up, `^bad.yaml:1: defaults.era_bridge: want auto, legacy-agents, 2026-agents, prefer-2026 or off, got "maybe"`},
		{"unknown redis key", "session_store: redis\nredis: {addr: r:6379, cluster: true}\n" + up, `^bad.yaml:2: redis.cluster: unknown key`},
	}
	for _, tc := range bad {
		if _, err := parseConfig("bad.yaml", []byte(tc.file), testEnv); err == nil || !regexp.MustCompile(tc.want).MatchString(err.Error()) {
			t.Errorf("%s: error %v, want match for %s", tc.name, err, tc.want)
		}
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	writeFile(t, file, "session_store: redis\nredis: {addr: a:1}\n"+up)
	env := env(map[string]string{"MCPHEAL_REDIS_PASSWORD": "pw"})
	rc, err := resolve(parseFlags(t, "--config", file, "--redis-addr", "b:2"), env, newCredCache())
	if err != nil || rc.store.Kind != "redis" || rc.store.Addr != "b:2" || rc.store.Password != "pw" {
		t.Fatalf("flag over file: %+v, %v", rc.store, err)
	}
	rc, err = resolve(parseFlags(t, "--upstream", "http://127.0.0.1:1/mcp"), env, newCredCache())
	if err != nil || rc.store.Kind != "memory" {
		t.Fatalf("default store: %+v, %v", rc.store, err)
	}
	if _, err := resolve(parseFlags(t, "--upstream", "http://127.0.0.1:1/mcp", "--session-store", "redis"), env, newCredCache()); err == nil {
		t.Fatal("--session-store redis without --redis-addr accepted")
	}
}

// TestKubernetesReplicasExample: the ConfigMap of the three-replica
// example is a valid config with the Redis store, inbound auth on its
// non-loopback listener and the key ring from the environment.
func TestKubernetesReplicasExample(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("examples/kubernetes/replicas.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env := env(map[string]string{"MCPHEAL_TOKEN": "0123456789abcdef-inbound", "TOOLS_TOKEN": "t",
		"MCPHEAL_REDIS_PASSWORD": "pw", "MCPHEAL_SESSION_KEYS": "1:" + strings.Repeat("A", 44)})
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
			Spec struct {
				Replicas int `yaml:"replicas"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("no ConfigMap with mcpheal.yaml in the example: %v", err)
		}
		cfg, ok := doc.Data["mcpheal.yaml"]
		if doc.Kind != "ConfigMap" || !ok {
			continue
		}
		f, err := parseConfig("replicas.yaml#mcpheal.yaml", []byte(cfg), env)
		if err != nil {
			t.Fatalf("example config: %v", err)
		}
		want := storeSpec{Kind: "redis", Addr: "valkey:6379", Password: "pw", Timeout: 250 * time.Millisecond}
		if f.Store != want || f.Defaults.SessionKeys == "" || len(f.AuthTokens) != 1 {
			t.Fatalf("example config: store %+v, keys set %v, %d tokens", f.Store, f.Defaults.SessionKeys != "", len(f.AuthTokens))
		}
		dir := t.TempDir()
		file := filepath.Join(dir, "mcpheal.yaml")
		writeFile(t, file, cfg)
		if _, err := resolve(parseFlags(t, "--config", file), env, newCredCache()); err != nil {
			t.Fatalf("example config does not resolve: %v", err)
		}
		return
	}
}
