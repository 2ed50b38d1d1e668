package main

import (
	"path/filepath"
	"regexp"
	"testing"
	"time"
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
