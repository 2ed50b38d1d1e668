//go:build unix

package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The fakes of the fault matrix (pyfaults_test.go), each standing beside
// the real servers for a fault a real server cannot make on cue: a TCP
// relay that cuts, forgets idle flows or refuses connections; the official
// Go SDK server in process, whose write tool can wait for the relay; and a
// wrapper of it that answers a forgotten session as WordPress.com does.

// faultRelay is a TCP relay on 127.0.0.1 in front of an MCP server. Its
// faults, each off until set:
//   - idleDrop: a flow idle that long is dropped silently, as a NAT or a
//     load balancer forgets an idle flow: nothing is sent to either end
//     when it is dropped; the next bytes the client sends on it are
//     answered with a reset (AWS's NAT gateway and load balancers do so);
//   - arm: the server bytes that hold an armed pattern are the last of
//     their connection (both ends reset right after them), once; arming
//     several patterns cuts at the first met, and the relay then cuts no
//     more;
//   - cutRequest: a request that holds a tag matching the pattern goes to
//     the server, and nothing of its answer comes back: once hold(tag)
//     returns (the server ran it), both ends are reset; once per tag (the
//     same request sent again passes);
//   - refuseGet: a GET (a client opening its standing stream) is answered
//     405 by the relay, as a gateway that serves no long-lived stream does,
//     and its connection closed;
//   - down/up: the listener closes (connections are refused, as when a
//     server is redeployed) and opens again on the same port.
type faultRelay struct {
	t      testing.TB
	target string // the server's host:port
	path   string
	addr   string // the relay's host:port

	idleDrop  time.Duration
	refuseGet bool

	cutRequest *regexp.Regexp
	hold       func(tag string) // called with a request's tag before its connection is cut

	mu    sync.Mutex // protects ln, flows, armed, closed
	ln    net.Listener
	flows map[*flow]bool
	armed map[string]bool // cutAfter patterns not yet met
	held  map[string]bool // cutRequest tags already cut: a resend passes

	wg     sync.WaitGroup
	stop   chan struct{} // closed by close: the janitor ends
	closed bool
	drops  atomic.Int32 // flows dropped idle
	resets atomic.Int32 // dropped flows reset when the client sent on them
	cuts   atomic.Int32 // connections cut by cutAfter or cutRequest
}

// flow is one relayed connection.
type flow struct {
	in, out net.Conn
	last    atomic.Int64 // unix nanos of the last byte either way
	dropped atomic.Bool  // forgotten by idleDrop
	held    atomic.Bool  // carries a cutRequest request: answers are not relayed
	cut     atomic.Bool
}

// startFaultRelay relays to the server at serverURL until the test ends.
// configure, if not nil, sets the relay's faults before it accepts.
func startFaultRelay(t testing.TB, serverURL string, configure func(*faultRelay)) *faultRelay {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	r := &faultRelay{t: t, target: u.Host, path: u.Path, flows: map[*flow]bool{}, armed: map[string]bool{}, held: map[string]bool{}}
	if configure != nil {
		configure(r)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.ln, r.addr = ln, ln.Addr().String()
	r.wg.Add(1)
	go r.accept(ln)
	r.stop = make(chan struct{})
	if r.idleDrop > 0 {
		r.wg.Add(1)
		go r.janitor(r.stop)
	}
	t.Cleanup(r.close)
	return r
}

// url is the relayed MCP endpoint.
func (r *faultRelay) url() string { return "http://" + r.addr + r.path }

func (r *faultRelay) close() {
	close(r.stop)
	r.mu.Lock()
	r.closed = true
	if r.ln != nil {
		_ = r.ln.Close()
	}
	for f := range r.flows {
		_ = f.in.Close()
		_ = f.out.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// down closes the listener and resets every relayed connection: from now
// on a connection to the relay is refused.
func (r *faultRelay) down() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		_ = r.ln.Close()
		r.ln = nil
	}
	for f := range r.flows {
		resetConn(f.in)
		resetConn(f.out)
	}
}

// up listens again on the relay's port.
func (r *faultRelay) up() {
	r.t.Helper()
	var ln net.Listener
	var err error
	for range 100 { // the closed listener's port may linger a moment
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		r.t.Errorf("relay up again on %s: %v", r.addr, err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_ = ln.Close()
		return
	}
	r.ln = ln
	r.wg.Add(1)
	go r.accept(ln)
}

// arm makes the next server bytes holding pattern the last of their
// connection.
func (r *faultRelay) arm(pattern string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed[pattern] = true
}

func (r *faultRelay) accept(ln net.Listener) {
	defer r.wg.Done()
	for {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", r.target)
		if err != nil {
			resetConn(in) // the server is not there: as a refused connection
			continue
		}
		f := &flow{in: in, out: out}
		f.touch()
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = in.Close()
			_ = out.Close()
			return
		}
		r.flows[f] = true
		r.wg.Add(2)
		r.mu.Unlock()
		go r.toServer(f)
		go r.toClient(f)
	}
}

func (f *flow) touch() { f.last.Store(time.Now().UnixNano()) }

// janitor drops the flows idle past idleDrop, silently.
func (r *faultRelay) janitor(stop chan struct{}) {
	defer r.wg.Done()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		now := time.Now().UnixNano()
		r.mu.Lock()
		for f := range r.flows {
			if !f.dropped.Load() && now-f.last.Load() > int64(r.idleDrop) && f.dropped.CompareAndSwap(false, true) {
				r.drops.Add(1)
				// The server's end is gone for good (its next write would
				// meet a reset); the client is told nothing.
				resetConn(f.out)
			}
		}
		r.mu.Unlock()
	}
}

// toServer copies the client's bytes to the server.
func (r *faultRelay) toServer(f *flow) {
	defer r.wg.Done()
	defer r.forget(f)
	buf := make([]byte, 32<<10)
	var tail []byte // the last bytes seen, so that a tag split across reads is found
	for {
		n, err := f.in.Read(buf)
		if n > 0 {
			if f.dropped.Load() {
				r.resets.Add(1)
				resetConn(f.in)
				return
			}
			f.touch()
			chunk := buf[:n]
			if r.refuseGet && bytes.HasPrefix(chunk, []byte("GET ")) {
				f.held.Store(true) // nothing more of the server's reaches the client
				_, _ = io.WriteString(f.in, "HTTP/1.1 405 Method Not Allowed\r\nAllow: POST, DELETE\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
				_ = f.in.Close()
				_ = f.out.Close()
				return
			}
			tag := ""
			if r.cutRequest != nil && !f.held.Load() {
				seen := append(tail, chunk...)
				if m := r.cutRequest.Find(seen); m != nil && r.holdOnce(string(m)) {
					tag = string(m)
					f.held.Store(true)
				}
				tail = append(tail[:0], seen[max(0, len(seen)-128):]...)
			}
			if _, werr := f.out.Write(chunk); werr != nil {
				_ = f.in.Close()
				return
			}
			if tag != "" {
				r.hold(tag)
				r.cuts.Add(1)
				f.cut.Store(true)
				resetConn(f.in)
				resetConn(f.out)
				return
			}
		}
		if err != nil {
			if f.dropped.Load() || f.cut.Load() {
				_ = f.in.Close()
				return
			}
			if cw, ok := f.out.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				_ = cw.CloseWrite()
				return
			}
			_ = f.out.Close()
			return
		}
	}
}

// toClient copies the server's bytes to the client, but those of a held
// or dropped flow, and cuts after an armed pattern.
func (r *faultRelay) toClient(f *flow) {
	defer r.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := f.out.Read(buf)
		if n > 0 && !f.dropped.Load() && !f.held.Load() {
			f.touch()
			if _, werr := f.in.Write(buf[:n]); werr != nil {
				_ = f.out.Close()
				return
			}
			if r.matchArmed(buf[:n]) {
				r.cuts.Add(1)
				f.cut.Store(true)
				resetConn(f.in)
				resetConn(f.out)
				return
			}
		}
		if err != nil {
			switch {
			case f.dropped.Load() || f.held.Load() || f.cut.Load():
				// Silent toward the client: a dropped flow is reset only
				// when the client sends on it; a held one when its request
				// ran (toServer).
			case isReset(err):
				resetConn(f.in) // a killed server resets; so does the relay
			default:
				_ = f.in.Close()
			}
			return
		}
	}
}

// holdOnce reports whether tag's request is to be cut: the first time it
// is seen.
func (r *faultRelay) holdOnce(tag string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held[tag] {
		return false
	}
	r.held[tag] = true
	return true
}

// matchArmed reports whether b holds an armed pattern, disarming it.
func (r *faultRelay) matchArmed(b []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.armed {
		if bytes.Contains(b, []byte(p)) {
			clear(r.armed)
			return true
		}
	}
	return false
}

func (r *faultRelay) forget(f *flow) {
	r.mu.Lock()
	delete(r.flows, f)
	r.mu.Unlock()
}

// resetConn closes c with an RST.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// goFaultServer is the official Go SDK server (stateful, the session era,
// SSE answers) served in process, with the tools the Python servers have
// for the matrix: echo (readOnlyHint) and write, which counts its runs per
// tag. A write whose tag the relay holds (cutRequest) waits after it ran
// until the relay cut its connection, so that its answer never leaves.
type goFaultServer struct {
	url string

	mu     sync.Mutex // protects counts, ran, gate
	counts map[string]int
	ran    map[string]chan struct{} // closed when the tag's write ran
	gate   map[string]chan struct{} // closed when that write may answer
}

// goHeld matches the tags of writes whose answers the relay keeps back.
var goHeld = regexp.MustCompile(`CUT-[A-Za-z0-9_.-]+`)

// startGoFaultServer serves the Go SDK server on 127.0.0.1; wrap, if not
// nil, wraps its handler (the WordPress dialect).
func startGoFaultServer(t testing.TB, wrap func(http.Handler) http.Handler) *goFaultServer {
	t.Helper()
	g := &goFaultServer{counts: map[string]int{}, ran: map[string]chan struct{}{}, gate: map[string]chan struct{}{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "mcpheal-interop-go", Version: "1.0.0"}, nil)
	type echoIn struct {
		Text string `json:"text"`
	}
	type writeIn struct {
		Tag string `json:"tag"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Description: "Echoes text.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "write", Description: "Records one execution. Not replay-safe."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, any, error) {
			ran, gate := g.record(in.Tag)
			if ran != nil {
				close(ran)
				select { // the relay cuts the connection, then opens the gate
				case <-gate:
				case <-time.After(10 * time.Second):
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "wrote " + in.Tag}}}, nil, nil
		})
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	if wrap != nil {
		h = wrap(h)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		_ = hs.Close()
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
	})
	g.url = "http://" + ln.Addr().String() + "/mcp"
	return g
}

// record counts one run of tag; for a held tag it returns the channels the
// relay and the tool meet on.
func (g *goFaultServer) record(tag string) (ran, gate chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.counts[tag]++
	if !goHeld.MatchString(tag) || g.counts[tag] > 1 {
		return nil, nil
	}
	return g.chans(tag)
}

func (g *goFaultServer) chans(tag string) (ran, gate chan struct{}) {
	if g.ran[tag] == nil {
		g.ran[tag], g.gate[tag] = make(chan struct{}), make(chan struct{})
	}
	return g.ran[tag], g.gate[tag]
}

// hold is the relay's cutRequest hook: it waits (10 s at most) until the
// write tagged tag ran, and opens its gate once the relay has cut (the
// relay cuts when hold returns; the tool then answers into a closed
// connection).
func (g *goFaultServer) hold(tag string) {
	g.mu.Lock()
	ran, gate := g.chans(tag)
	g.mu.Unlock()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
	}
	go func() { time.Sleep(50 * time.Millisecond); close(gate) }()
}

// runs counts the executions of tag.
func (g *goFaultServer) runs(tag string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.counts[tag]
}

// wordPressDialect wraps an MCP handler so that a session it has been told
// to forget gets what WordPress.com's MCP server answers a session it no
// longer knows: HTTP 200 and the JSON-RPC error -32602 "Invalid params:
// Invalid or expired session" (to a notification too, with id null). Its
// GET stream is refused with 405, as WordPress serves none.
type wordPressDialect struct {
	h http.Handler

	mu    sync.Mutex // protects known
	known map[string]bool
}

func newWordPressDialect(h http.Handler) *wordPressDialect {
	return &wordPressDialect{h: h, known: map[string]bool{}}
}

// forgetAll forgets every session, as a restarted WordPress does.
func (w *wordPressDialect) forgetAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.known)
}

func (w *wordPressDialect) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		http.Error(rw, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	sid := r.Header.Get("Mcp-Session-Id")
	if sid != "" && r.Method == http.MethodPost {
		w.mu.Lock()
		ok := w.known[sid]
		w.mu.Unlock()
		if !ok {
			body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			var m struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.Unmarshal(body, &m)
			id := m.ID
			if len(id) == 0 {
				id = json.RawMessage("null")
			}
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(rw, `{"jsonrpc":"2.0","id":`+string(id)+`,"error":{"code":-32602,"message":"Invalid params: Invalid or expired session"}}`)
			return
		}
	}
	w.h.ServeHTTP(&sessionSpy{ResponseWriter: rw, w: w}, r)
}

// sessionSpy learns the session ids the wrapped server hands out.
type sessionSpy struct {
	http.ResponseWriter
	w      *wordPressDialect
	headed bool
}

func (s *sessionSpy) WriteHeader(code int) {
	if s.headed {
		return
	}
	s.headed = true
	if sid := s.Header().Get("Mcp-Session-Id"); sid != "" && code < 300 {
		s.w.mu.Lock()
		s.w.known[sid] = true
		s.w.mu.Unlock()
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *sessionSpy) Write(b []byte) (int, error) {
	if !s.headed {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

func (s *sessionSpy) Flush() {
	if !s.headed {
		s.WriteHeader(http.StatusOK)
	}
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *sessionSpy) Unwrap() http.ResponseWriter { return s.ResponseWriter }
