package proxy

// Sessions that outlive mcpheal (docs/deployment.md "Sessions that outlive mcpheal"):
// the agent-facing id is the session's sealed recipe, so a new process given
// the same key ring heals any session from its id alone.

import (
	"crypto/rand"
	"encoding/base64"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// testKeys returns a key ring string of n fresh keys.
func testKeys(ids ...int) string {
	out := ""
	for i, id := range ids {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		if i > 0 {
			out += ","
		}
		out += strconv.Itoa(id) + ":" + base64.StdEncoding.EncodeToString(b)
	}
	return out
}

// proxyProcess is one mcpheal "process" on a fixed address: kill ends it
// at once, as kill -9 would (no DELETE upstream, no drain).
type proxyProcess struct {
	s    *Server
	ln   *trackingListener
	done chan struct{}
}

// trackingListener remembers the connections it accepted, so that kill can
// cut them all, as the kernel does for a killed process.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) cutAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, as for a killed process
		}
		_ = c.Close()
	}
}

func startProxyAt(t testing.TB, addr, upstream string, mod func(*conf.Config)) *proxyProcess {
	t.Helper()
	var ln net.Listener
	var err error
	for try := 0; try < 50; try++ { // the previous process's port may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg := conf.Config{Upstream: upstream, Listen: ln.Addr().String(), HealTimeout: 5 * time.Second, AdminListen: "off"}
	if mod != nil {
		mod(&cfg)
	}
	logs := &testLog{t: t}
	s, err := New(cfg, zerolog.New(logs).Level(zerolog.DebugLevel))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy %s log:\n%s", ln.Addr(), logs.String())
		}
	})
	p := &proxyProcess{s: s, ln: &trackingListener{Listener: ln}, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		_ = s.Serve(p.ln)
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *proxyProcess) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.ln.Close()
	p.ln.cutAll()
	p.s.Close() // no DELETE upstream: a killed process says no goodbye
	<-p.done
}

// TestRestartHealsFromID: mcpheal dies (no goodbye to the upstream) and a
// new process with the same key ring takes its address. The official Go SDK
// client, which ends its session for good on a 404, goes on: its next call
// succeeds after one upstream initialize, and the call ran once.
func TestRestartHealsFromID(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	keys := testKeys(1)
	a := startProxyAt(t, "127.0.0.1:0", up.URL(), func(c *conf.Config) { c.SessionKeys = keys })
	addr := a.ln.Addr().String()
	cs := peers.GoSDKClient(t, "http://"+addr+"/mcp")
	peers.CallEcho(t, cs, "before")
	inits := up.Inits()
	a.kill()
	b := startProxyAt(t, addr, up.URL(), func(c *conf.Config) { c.SessionKeys = keys })
	peers.CallEcho(t, cs, "after the restart")
	if n := up.Inits() - inits; n != 1 {
		t.Fatalf("%d upstream initializes after the restart, want 1", n)
	}
	if n := up.ToolCalls("echo"); n != 2 {
		t.Fatalf("echo ran %d times, want 2", n)
	}
	if n := b.s.count.Restored.Load(); n != 1 {
		t.Fatalf("%d sessions restored, want 1", n)
	}
	peers.CallEcho(t, cs, "and again") // the restored session is a live one now
	if n := up.Inits() - inits; n != 1 {
		t.Fatalf("%d upstream initializes, want still 1", n)
	}
}

// TestRestartWithoutTheKey: a new process with another key ring cannot open
// the old ids: the agent gets the spec's 404, as before sealed ids.
func TestRestartWithoutTheKey(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	a := startProxyAt(t, "127.0.0.1:0", up.URL(), func(c *conf.Config) { c.SessionKeys = testKeys(1) })
	addr := a.ln.Addr().String()
	sid := peers.RawInitialize(t, "http://"+addr+"/mcp")
	a.kill()
	startProxyAt(t, addr, up.URL(), func(c *conf.Config) { c.SessionKeys = testKeys(1) })
	resp, body := peers.RawPost(t, "http://"+addr+"/mcp", sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if code, _, _ := rpcError(t, body); resp.StatusCode != http.StatusNotFound || code != wire.CodeSessionNotFound {
		t.Fatalf("foreign-key id: %d %s; want 404 -32001", resp.StatusCode, body)
	}
}

// TestRotatedRingOpensOldIDs: a process whose ring seals with a new key and
// keeps the old one to open still heals sessions sealed under the old key.
func TestRotatedRingOpensOldIDs(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	old := testKeys(1)
	a := startProxyAt(t, "127.0.0.1:0", up.URL(), func(c *conf.Config) { c.SessionKeys = old })
	addr := a.ln.Addr().String()
	sid := peers.RawInitialize(t, "http://"+addr+"/mcp")
	a.kill()
	startProxyAt(t, addr, up.URL(), func(c *conf.Config) { c.SessionKeys = testKeys(2) + "," + old })
	resp, body := peers.RawPost(t, "http://"+addr+"/mcp", sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if resp.StatusCode != http.StatusOK || !rpcAnswer(body).Get("result").Exists() {
		t.Fatalf("old id under the rotated ring: %d %s", resp.StatusCode, body)
	}
}

// TestSealedIDRefusals: a tampered id, another credential, and a deleted
// session's id are all answered as unknown sessions; none reaches the
// upstream.
func TestSealedIDRefusals(t *testing.T) {
	t.Parallel()
	up := startAuthServer(t, map[string]string{"victim-token-0001": "alice", "attacker-token-01": "mallory"})
	keys := testKeys(1)
	a := startProxyAt(t, "127.0.0.1:0", up.url, func(c *conf.Config) { c.SessionKeys = keys })
	addr := a.ln.Addr().String()
	url := "http://" + addr + "/mcp"
	sid := authInit(t, url, "victim-token-0001")
	gone := authInit(t, url, "victim-token-0001")
	req, _ := http.NewRequest(http.MethodDelete, url, nil)
	req.Header.Set("Mcp-Session-Id", gone)
	req.Header.Set("Authorization", "Bearer victim-token-0001")
	if resp, _ := peers.RawDo(t, req); resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	a.s.sessions.Store.Remove(session.ClientID(sid)) // as if the process had lost it: the next use restores
	inits := up.rec.calls("initialize")
	tampered := []byte(sid)
	tampered[len(tampered)/2] ^= 1
	for name, c := range map[string]struct{ sid, token string }{
		"tampered":           {string(tampered), "victim-token-0001"},
		"other credential":   {sid, "attacker-token-01"},
		"no credential":      {sid, ""},
		"deleted":            {gone, "victim-token-0001"},
		"garbage":            {"not-an-id", "victim-token-0001"},
		"another upstream's": {foreignID(t, keys), "victim-token-0001"},
	} {
		resp, body := authPost(t, url, c.sid, c.token, echoCall)
		if code, _, _ := rpcError(t, body); resp.StatusCode != http.StatusNotFound || code != wire.CodeSessionNotFound {
			t.Errorf("%s: %d %s; want 404 -32001", name, resp.StatusCode, body)
		}
	}
	if n := up.rec.calls("initialize") - inits; n != 0 {
		t.Fatalf("%d upstream initializes for refused ids, want 0", n)
	}
	if resp, body := authPost(t, url, sid, "victim-token-0001", echoCall); resp.StatusCode != http.StatusOK {
		t.Fatalf("the owner's id after the attempts: %d %s", resp.StatusCode, body)
	}
}

// foreignID returns an id sealed with keys for another upstream's name.
func foreignID(t *testing.T, keys string) string {
	t.Helper()
	ring, err := heal.NewRing(keys)
	if err != nil {
		t.Fatal(err)
	}
	ss := &heal.Sessions{Cfg: &conf.Config{Name: "another", SessionMaxAge: time.Hour}, Ring: ring}
	id, _ := ss.Seal(nil, "2025-11-25", []byte(`{}`))
	return string(id)
}

func TestNewRingRefusesBadKeys(t *testing.T) {
	t.Parallel()
	for _, keys := range []string{"1", "0:abc", "1:" + base64.StdEncoding.EncodeToString([]byte("short"))} {
		if _, err := New(conf.Config{Upstream: "http://127.0.0.1:1/mcp", SessionKeys: keys}, zerolog.Nop()); err == nil {
			t.Errorf("New with session keys %q: no error", keys)
		}
	}
}
