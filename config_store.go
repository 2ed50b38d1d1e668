package main

// The shared session store (docs/deployment.md "Replicas"): session_store and redis in
// the config file, --session-store and --redis-* on the command line. One
// store serves every upstream (each under its own key prefix); a change
// applies at restart only.

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/session/redisstore"
)

// storeSpec is the session store setting.
type storeSpec struct {
	Kind     string // "memory" (the default) or "redis"
	Addr     string
	Username string
	Password string // from ${ENV} or MCPHEAL_REDIS_PASSWORD, never a literal
	DB       int
	TLS      bool
	Timeout  time.Duration // each store call; 0: proxy's default
}

var redisKeys = []string{"addr", "username", "password", "db", "tls", "timeout"}

// sessionStore reads session_store: memory or redis.
func (p *parser) sessionStore(v *yaml.Node, f *fileConfig) {
	switch s := p.str(v, "session_store"); s {
	case "memory", "redis":
		f.Store.Kind = s
	default:
		p.errorf(v, "session_store", "want memory or redis, got %q", s)
	}
}

// redis reads the redis mapping.
func (p *parser) redis(v *yaml.Node, f *fileConfig) {
	p.mapping(v, "redis.", redisKeys, func(k string, _, rv *yaml.Node) {
		key := "redis." + k
		switch k {
		case "addr":
			f.Store.Addr = p.str(rv, key)
			if _, _, err := net.SplitHostPort(f.Store.Addr); err != nil {
				p.errorf(rv, key, "want host:port, got %q", f.Store.Addr)
			}
		case "username":
			f.Store.Username = p.expand(rv, key, p.str(rv, key))
		case "password":
			f.Store.Password = p.secret(rv, key, `"${MCPHEAL_REDIS_PASSWORD}"`)
		case "db":
			if rv.Value == "0" {
				return
			}
			f.Store.DB = p.positive(rv, key)
		case "tls":
			f.Store.TLS = p.boolean(rv, key)
		case "timeout":
			f.Store.Timeout = p.duration(rv, key, false)
		}
	})
}

// checkStore reports a redis store without an address, or redis settings
// for the memory store.
func (p *parser) checkStore(root *yaml.Node, f *fileConfig) {
	if f.Store.Kind == "redis" && f.Store.Addr == "" {
		p.errorf(root, "redis.addr", "session_store: redis needs redis.addr (host:port)")
	}
	if f.Store.Kind != "redis" && f.Store.Addr != "" {
		p.errorf(root, "session_store", "redis is set but session_store is not redis")
	}
}

// storeFlags are the command-line spellings of storeSpec.
func storeFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.store.Kind, "session-store", "memory",
		"where sessions' changing state lives: memory (this process) or redis (shared by replicas)")
	fs.StringVar(&o.store.Addr, "redis-addr", "", "Redis or Valkey host:port for --session-store redis (password: MCPHEAL_REDIS_PASSWORD)")
	fs.BoolVar(&o.store.TLS, "redis-tls", false, "connect to Redis over TLS")
	fs.DurationVar(&o.store.Timeout, "store-timeout", 250*time.Millisecond,
		"most one session-store call may take before the process carries on alone")
}

// resolveStore is the store of the command line over the file's.
func resolveStore(o *options, f *fileConfig, lookup func(string) (string, bool)) (storeSpec, error) {
	var sp storeSpec
	if f != nil {
		sp = f.Store
	}
	if o.set["session-store"] {
		sp.Kind = o.store.Kind
	}
	if o.set["redis-addr"] {
		sp.Addr = o.store.Addr
	}
	if o.set["redis-tls"] {
		sp.TLS = o.store.TLS
	}
	if o.set["store-timeout"] {
		sp.Timeout = o.store.Timeout
	}
	if sp.Password == "" {
		sp.Password, _ = lookup("MCPHEAL_REDIS_PASSWORD")
	}
	switch sp.Kind {
	case "", "memory":
		sp.Kind = "memory"
	case "redis":
		if _, _, err := net.SplitHostPort(sp.Addr); err != nil {
			return sp, fmt.Errorf("--session-store redis needs --redis-addr host:port (redis.addr), got %q", sp.Addr)
		}
	default:
		return sp, fmt.Errorf("--session-store: want memory or redis, got %q", sp.Kind)
	}
	return sp, nil
}

// openStore connects the store and points every upstream at it; nil for
// the memory store.
func openStore(sp storeSpec, ups []proxy.Config) (*redisstore.Store, error) {
	if sp.Kind != "redis" {
		return nil, nil
	}
	var maxAge time.Duration // keys live as long as the longest-lived ids
	for _, c := range ups {
		maxAge = max(maxAge, c.SessionMaxAge)
	}
	cfg := redisstore.Config{Addr: sp.Addr, Username: sp.Username, Password: sp.Password, DB: sp.DB,
		Timeout: sp.Timeout, TTL: maxAge}
	if sp.TLS {
		host, _, _ := net.SplitHostPort(sp.Addr)
		cfg.TLS = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	st, err := redisstore.New(cfg)
	if err != nil {
		return nil, err
	}
	attachStore(st, ups, sp.Timeout)
	return st, nil
}

// attachStore points every upstream at st, each under its own name.
func attachStore(st *redisstore.Store, ups []proxy.Config, timeout time.Duration) {
	if st == nil {
		return
	}
	for i := range ups {
		ups[i].Shared = st.For(ups[i].Name)
		ups[i].StoreTimeout = timeout
	}
}

func (sp storeSpec) String() string {
	if sp.Kind != "redis" {
		return "memory"
	}
	s := "redis://" + sp.Addr + "/" + strconv.Itoa(sp.DB)
	if sp.TLS {
		s = "rediss://" + sp.Addr + "/" + strconv.Itoa(sp.DB)
	}
	return s
}
