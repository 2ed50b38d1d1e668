//go:build unix

package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// bridgeHeld is what the memory budget should hold once no answer is in
// flight: the sessions' cost and what server/discover said.
func bridgeHeld(s *Server) int64 {
	var n int64
	for _, sess := range s.sessions.Store.Sessions() {
		n += wire.SessionCost(sess)
	}
	if d := s.eras.Info.Load(); d != nil {
		n += d.Size()
	}
	return n
}

// TestBridgeInitializeAnswersCountInBudget: a bridged initialize is
// answered from server/discover, instructions included, and each answer is
// a copy held until the agent has taken it. With instructions of 8 MiB
// and a memory budget of 32 MiB, eight agents that initialize at once and
// read their answers slowly (a 4 KiB receive buffer: the kernel's socket
// buffers, up to 4 MiB here, cannot take an answer off mcpheal's hands)
// cannot make mcpheal hold 64 MiB of answers:
// those that do not fit get mcpheal's budget error (HTTP 200) and
// Retry-After, the budget's count never passes its limit, and it comes
// back to the sessions' cost once the answers are written (or their agent
// has gone).
func TestBridgeInitializeAnswersCountInBudget(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	up := startScriptedModern(t, &scriptedModern{
		discover: modernDiscover(`{"tools":{}}`, `"`+strings.Repeat("i", size)+`"`),
	})
	s, url := startProxy(t, up.url, func(c *conf.Config) { c.MemoryBudget = 4 * size })
	limit := s.mem.Limit

	// One agent first: the upstream's era is asked, and the budget's base
	// is known.
	peers.RawInitialize(t, url)
	peers.Wait(t, "the first answer let go", func() bool { return s.mem.Used.Load() == bridgeHeld(s) })

	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if u := s.mem.Used.Load(); u > peak.Load() {
				peak.Store(u)
			}
			select {
			case <-stop:
				return
			default:
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()

	// Agents that read their answer's head, then nothing until every
	// agent has its head: the answers that were admitted are all held at
	// once, the way slow agents hold them.
	const agents = 8
	type answer struct {
		err    error
		status int
		code   int64
		retry  string
		sid    string
		body   []byte
	}
	answers := make([]answer, agents)
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp")
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},` +
		`"clientInfo":{"name":"slow-agent","version":"1"}}}`
	raw := "POST /mcp HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
		"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n" +
		"Content-Length: " + strconv.Itoa(len(init)) + "\r\n\r\n" + init
	var heads, done sync.WaitGroup
	var left atomic.Bool // one agent with a 200 has gone away
	release := make(chan struct{})
	heads.Add(agents)
	done.Add(agents)
	for i := range agents {
		go func() {
			defer done.Done()
			a := &answers[i]
			headDone := sync.OnceFunc(heads.Done)
			defer headDone()
			d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) {
					_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
				})
			}}
			c, err := d.Dial("tcp", addr)
			if a.err = err; err != nil {
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(4 * peers.Timeout))
			if _, a.err = io.WriteString(c, raw); a.err != nil {
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if a.err = err; err != nil {
				return
			}
			a.status, a.retry, a.sid = resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Mcp-Session-Id")
			headDone()
			<-release
			if a.sid != "" && left.CompareAndSwap(false, true) {
				return // this agent goes away without its answer
			}
			a.body, a.err = io.ReadAll(resp.Body)
			a.code = gjson.GetBytes(a.body, "error.code").Int()
		}()
	}
	heads.Wait()
	held := s.mem.Used.Load()
	close(release)
	done.Wait()
	close(stop)
	<-sampled

	ok, refused := 0, 0
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Errorf("agent %d: %v", i, a.err)
		case a.status == http.StatusOK && a.sid != "":
			ok++
			if a.sid == "" {
				t.Errorf("agent %d: 200 without a session id", i)
			}
			if a.body != nil && len(gjson.GetBytes(a.body, "result.instructions").Str) != size {
				t.Errorf("agent %d: 200 whose instructions are %d bytes, want %d", i, len(gjson.GetBytes(a.body, "result.instructions").Str), size)
			}
		case a.status == http.StatusOK && (a.code == wire.CodeBudget || a.code == wire.CodeTooMany) && a.retry != "":
			refused++
		default:
			t.Errorf("agent %d: %d %.200s (Retry-After %q); want 200, or 200 with %d or %d and Retry-After",
				i, a.status, a.body, a.retry, wire.CodeBudget, wire.CodeTooMany)
		}
	}
	t.Logf("%d answered, %d refused; the budget counted %d bytes at most, %d with every head sent, of %d", ok, refused, peak.Load(), held, limit)
	if ok == 0 || refused == 0 {
		t.Errorf("%d of %d initializes answered 200 and %d refused; want those that fit in the %d-byte budget answered "+
			"(%d bytes of instructions each) and the others refused", ok, agents, refused, limit, size)
	}
	if p := max(peak.Load(), held); p > limit {
		t.Errorf("the memory budget counted %d bytes during the burst, past its limit of %d", p, limit)
	}
	if held < int64(ok-1)*size {
		t.Errorf("the memory budget counted %d bytes while %d answers of %d bytes waited for their agents; want them counted",
			held, ok, size)
	}
	peers.Wait(t, "the answers let go", func() bool { return s.mem.Used.Load() == bridgeHeld(s) })

	// Nothing broke: the sessions created work, and once the answers are
	// gone a new agent fits again.
	for i, a := range answers {
		if a.sid == "" {
			continue
		}
		if resp, body := peers.RawPost(t, url, a.sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); resp.StatusCode != http.StatusOK {
			t.Errorf("agent %d's ping after the burst: %d %s; want 200", i, resp.StatusCode, body)
		}
	}
	peers.RawInitialize(t, url)
	peers.Wait(t, "the last answer let go", func() bool { return s.mem.Used.Load() == bridgeHeld(s) })
	noPanics(t, s)
	if n := agentInits(up); n != 0 {
		t.Errorf("the upstream got %d initialize, want 0 (the bridge answers it)", n)
	}
	if n := len(up.received("server/discover", "")); n != 1 {
		t.Errorf("the upstream got %d server/discover, want 1 (every initialize is answered from the first)", n)
	}
}
