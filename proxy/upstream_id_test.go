package proxy

// An upstream session id mcpheal will not carry (link.go, maxUpstreamID):
// MCP sets no maximum, but every request of the session would carry it. The
// upstream that names its session with a 100 KB id gets one initialize,
// the session it made is DELETEd, and the agent hears why at once; nothing
// is retried, so nothing feeds the circuit breaker.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// bigIDUpstream is an MCP server on net/http whose initialize names the
// session with an Mcp-Session-Id of size bytes (visible ASCII) while size
// is set, and with a short one otherwise. It counts initializes and
// records the size of the session id of every DELETE.
type bigIDUpstream struct {
	url   string
	size  atomic.Int64 // 0: short ids
	inits atomic.Int64

	mu       sync.Mutex
	sessions map[string]bool
	deletes  []int // len(Mcp-Session-Id) of each DELETE
}

// bigIDSizes are the sizes of the ids tested: one that fits in the
// buffer the upstream client reads an answer's head into, and one that
// does not.
var bigIDSizes = []struct {
	name string
	size int
}{{"10KB", 10 << 10}, {"100KB", 100 << 10}}

// bigID is the n-th session's id of size bytes of visible ASCII (0x21
// to 0x7E).
func bigID(n int64, size int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "big-%d-", n)
	for i := 0; b.Len() < size; i++ {
		b.WriteByte(byte(0x21 + i%(0x7f-0x21)))
	}
	return b.String()
}

func startBigIDUpstream(t *testing.T) *bigIDUpstream {
	t.Helper()
	u := &bigIDUpstream{sessions: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// net/http's default (1 MB) takes a 100 KB header already; said
	// explicitly, since the DELETE of the big session depends on it.
	srv := &http.Server{Handler: u, MaxHeaderBytes: 1 << 20, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	u.url = "http://" + ln.Addr().String() + "/mcp"
	return u
}

func (u *bigIDUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	switch r.Method {
	case http.MethodDelete:
		u.mu.Lock()
		u.deletes = append(u.deletes, len(sid))
		delete(u.sessions, sid)
		u.mu.Unlock()
		w.WriteHeader(http.StatusOK)
		return
	case http.MethodPost:
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	if msg.Method == "initialize" {
		n := u.inits.Add(1)
		id := fmt.Sprintf("s-%d", n)
		if size := u.size.Load(); size > 0 {
			id = bigID(n, int(size))
		}
		u.mu.Lock()
		u.sessions[id] = true
		u.mu.Unlock()
		w.Header().Set("Mcp-Session-Id", id)
		writeJSON(w, msg.ID, `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"big-id","version":"1"}}`)
		return
	}
	u.mu.Lock()
	live := u.sessions[sid]
	u.mu.Unlock()
	switch {
	case sid == "":
		// A session-era server: anything but initialize needs a session
		// (mcpheal's server/discover probe gets this too).
		http.Error(w, "Bad Request: Mcp-Session-Id header is required", http.StatusBadRequest)
	case !live:
		http.Error(w, "session not found", http.StatusNotFound)
	case strings.HasPrefix(msg.Method, "notifications/"):
		w.WriteHeader(http.StatusAccepted)
	default:
		writeJSON(w, msg.ID, `{}`)
	}
}

// expire forgets every session.
func (u *bigIDUpstream) expire() {
	u.mu.Lock()
	clear(u.sessions)
	u.mu.Unlock()
}

// deleted reports whether a DELETE of a session id of size bytes arrived.
func (u *bigIDUpstream) deleted(size int) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, n := range u.deletes {
		if n == size {
			return true
		}
	}
	return false
}

// capLines returns the proxy's log lines that name the cap on upstream
// session ids.
func capLines(logs *testLog) []string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, fmt.Sprint(link.MaxUpstreamID)) {
			out = append(out, line)
		}
	}
	return out
}

// slowAgent is an agent that waits long enough to see what mcpheal
// answers however long it takes (peers.RawClient gives up after 5 s).
var slowAgent = &http.Client{Timeout: 30 * time.Second}

// slowPost is peers.RawPost by slowAgent; it also returns how long the
// answer took.
func slowPost(t *testing.T, url, sid, body string) (*http.Response, []byte, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := slowAgent.Do(peers.PostRequest(t, url, sid, body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read body: %v", url, err)
	}
	return resp, b, time.Since(start)
}

const bigIDInit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"big-id","version":"1"}}}`

// TestUpstreamSessionIDTooLong: the upstream answers the agent's initialize
// with a session id of 10 KB or 100 KB, past mcpheal's cap. The agent gets
// -32020 (HTTP 200) naming the cap at once; the upstream got one initialize and a
// DELETE of the session it made; the log says so in one line (without the
// id); and the breaker is still closed: the next initialize, with a short
// id, works. Before, a 10 KB id was carried on every request, and a 100 KB
// one made one agent initialize into 12 upstream sessions, none DELETEd,
// and after 7 s a 503 "circuit breaker open".
func TestUpstreamSessionIDTooLong(t *testing.T) {
	t.Parallel()
	for _, c := range bigIDSizes {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := startBigIDUpstream(t)
			_, url, logs := startProxyLog(t, up.url, nil)
			up.size.Store(int64(c.size))

			resp, body, took := slowPost(t, url, "", bigIDInit)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("initialize with a %s upstream id: %d %.300q after %v, %d upstream initializes; want 200 -32020",
					c.name, resp.StatusCode, body, took, up.inits.Load())
			}
			code, msg, id := rpcError(t, body)
			if code != wire.CodeUpstreamInvalid || id != "1" || !strings.Contains(msg, "Mcp-Session-Id") || !strings.Contains(msg, fmt.Sprint(link.MaxUpstreamID)) {
				t.Fatalf("initialize with a %s upstream id: %s; want -32020 naming the %d-byte cap on Mcp-Session-Id", c.name, body, link.MaxUpstreamID)
			}
			if took > time.Second {
				t.Errorf("the agent waited %v for the refusal; want it at once", took)
			}
			if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
				t.Errorf("the refusal carries a session id of %d bytes", len(sid))
			}
			if n := up.inits.Load(); n != 1 {
				t.Fatalf("%d upstream initializes for one agent initialize, want 1", n)
			}
			peers.Wait(t, "the DELETE of the upstream session with the "+c.name+" id", func() bool { return up.deleted(c.size) })

			lines := capLines(logs)
			if len(lines) != 1 || !strings.Contains(lines[0], "session id") {
				t.Errorf("%d log lines name the cap, want one about the upstream session id:\n%s", len(lines), strings.Join(lines, "\n"))
			}
			if strings.Contains(logs.String(), bigID(1, c.size)[:200]) {
				t.Error("the log holds the upstream session id")
			}

			// The breaker is closed: the upstream works again at once.
			up.size.Store(0)
			resp, body, _ = slowPost(t, url, "", bigIDInit)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" {
				t.Fatalf("initialize after the refusal, with a short upstream id: %d %s; want a session", resp.StatusCode, body)
			}
			if strings.Contains(logs.String(), "circuit breaker") {
				t.Errorf("the circuit breaker moved:\n%s", logs.String())
			}
			if n := up.inits.Load(); n != 2 {
				t.Fatalf("%d upstream initializes for two agent initializes, want 2", n)
			}
		})
	}
}

// TestHealMeetsTooLongSessionID: the upstream forgets a live session and,
// when mcpheal re-creates it, names the new one with an id past mcpheal's
// cap. The session cannot go on: the agent gets 404 at once (MCP's answer
// to a session that ended: it initializes again) rather than a storm of
// retries, the upstream gets one initialize for the heal and a DELETE of
// the session it made, the log names the cap, and the session stays
// ended.
func TestHealMeetsTooLongSessionID(t *testing.T) {
	t.Parallel()
	for _, c := range bigIDSizes {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := startBigIDUpstream(t)
			_, url, logs := startProxyLog(t, up.url, nil)
			sid := peers.RawInitialize(t, url)
			const ping = `{"jsonrpc":"2.0","id":2,"method":"ping"}`
			if resp, body := peers.RawPost(t, url, sid, ping); resp.StatusCode != http.StatusOK {
				t.Fatalf("ping: %d %s", resp.StatusCode, body)
			}

			up.expire()
			up.size.Store(int64(c.size))
			inits := up.inits.Load()
			resp, body, took := slowPost(t, url, sid, ping)
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("ping when the heal meets a %s upstream id: %d %.300q after %v, %d upstream initializes; want 404",
					c.name, resp.StatusCode, body, took, up.inits.Load()-inits)
			}
			if code, _, _ := rpcError(t, body); code != wire.CodeSessionNotFound {
				t.Fatalf("ping when the heal meets a %s upstream id: %s; want -32001", c.name, body)
			}
			if took > time.Second {
				t.Errorf("the agent waited %v for the 404; want it at once", took)
			}
			if n := up.inits.Load() - inits; n != 1 {
				t.Fatalf("%d upstream initializes for the heal, want 1", n)
			}
			peers.Wait(t, "the DELETE of the upstream session with the "+c.name+" id", func() bool { return up.deleted(c.size) })
			if len(capLines(logs)) == 0 {
				t.Error("no log line names the cap")
			}

			resp, body = peers.RawPost(t, url, sid, ping)
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("ping on the ended session: %d %s; want 404", resp.StatusCode, body)
			}
			if n := up.inits.Load() - inits; n != 1 {
				t.Fatalf("%d upstream initializes after the session ended, want still 1", n)
			}
			up.size.Store(0)
			peers.RawInitialize(t, url) // the agent starts over, and can
		})
	}
}
