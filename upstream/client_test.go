package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// rawServer accepts connections on 127.0.0.1 and hands each to handle.
func rawServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/mcp"
}

// countingServer is a rawServer that answers each request of a connection
// with answer (false: the connection ends there), and counts the
// connections it accepted.
func countingServer(t *testing.T, answer func(c net.Conn, req *fasthttp.Request) bool) (string, *atomic.Int32) {
	conns := new(atomic.Int32)
	url := rawServer(t, func(c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		for {
			req, err := readRequest(br)
			if err != nil || !answer(c, req) {
				return
			}
		}
	})
	return url, conns
}

// readRequest consumes one HTTP request from br.
func readRequest(br *bufio.Reader) (*fasthttp.Request, error) {
	req := new(fasthttp.Request)
	return req, req.Read(br)
}

func newClient(t *testing.T, url string) *Client {
	t.Helper()
	c, err := New(Config{URL: url, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func post(c *Client, body string, d time.Duration) (*Response, error) {
	return postWith(c.Do, body, d)
}

// postWith posts body with do (Client.Do or DoOnce) within d.
func postWith(do func(*fasthttp.Request, *Response, time.Time) error, body string, d time.Duration) (*Response, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	resp := AcquireResponse()
	err := do(req, resp, time.Now().Add(d))
	return resp, err
}

func TestDoJSONAndReuse(t *testing.T) {
	t.Parallel()
	conns := 0
	url := rawServer(t, func(c net.Conn) {
		conns++
		br := bufio.NewReader(c)
		for {
			req, err := readRequest(br)
			if err != nil {
				return
			}
			if string(req.Host()) == "" || string(req.RequestURI()) != "/mcp" {
				fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
				continue
			}
			b := req.Body()
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
		}
	})
	c := newClient(t, url)
	for i := range 3 {
		resp, err := post(c, fmt.Sprintf(`{"n":%d}`, i), time.Second)
		if err != nil {
			t.Fatalf("Do #%d: %v", i, err)
		}
		if got, want := string(resp.Body()), fmt.Sprintf(`{"n":%d}`, i); got != want || resp.StatusCode() != 200 {
			t.Fatalf("Do #%d = %d %q, want 200 %q", i, resp.StatusCode(), got, want)
		}
		ReleaseResponse(resp)
	}
	if conns != 1 {
		t.Fatalf("connections = %d, want 1 (keep-alive reuse)", conns)
	}
}

// TestDoChunkedAndReuse: a JSON answer with a chunked body (the TypeScript
// SDK v2's web-standard handler behind node:http sends them) is read with
// the end of its chunks, its trailer section: the connection is clean for
// the next request, even one that must not run twice (it gives up a
// connection with unread bytes), and a trailer field is not taken for the
// next answer's head.
func TestDoChunkedAndReuse(t *testing.T) {
	t.Parallel()
	url, conns := countingServer(t, func(c net.Conn, req *fasthttp.Request) bool {
		b := req.Body()
		trailer := ""
		if string(b) == `{"trailer":true}` {
			trailer = "X-Checksum: 1\r\n"
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"+
			"%x\r\n%s\r\n0\r\n%s\r\n", len(b), b, trailer)
		return true
	})
	c := newClient(t, url)
	// The request after the trailer may run twice: it takes the pooled
	// connection without looking at what is left in it.
	for i, body := range []string{`{"n":1}`, `{"trailer":true}`, `{"n":2}`, `{"n":3}`} {
		do := c.DoOnce
		if i == 2 {
			do = c.Do
		}
		echoed(t, do, i, body)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1: a chunked answer read to its end leaves its connection for the next request", n)
	}
}

// TestDoChunkedTrailerGoneWrong: a chunked answer whose trailer section
// does not end well is still the answer (the server has sent all of it);
// only its connection is not used again. The server closes after the last
// chunk, before the empty line; it sends a trailer field fasthttp refuses.
func TestDoChunkedTrailerGoneWrong(t *testing.T) {
	t.Parallel()
	url, conns := countingServer(t, func(c net.Conn, req *fasthttp.Request) bool {
		b := req.Body()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n", len(b), b)
		switch string(b) {
		case `{"cut":true}`:
			return false // closed before the trailer's empty line
		case `{"refused":true}`:
			io.WriteString(c, "Content-Length: 3\r\n\r\n")
		default:
			io.WriteString(c, "\r\n")
		}
		return true
	})
	c := newClient(t, url)
	for i, body := range []string{`{"cut":true}`, `{"n":1}`, `{"refused":true}`, `{"n":2}`} {
		echoed(t, c.DoOnce, i, body)
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3: each answer whose trailer went wrong gives up its connection", n)
	}
}

// echoed posts body with do (Client.Do or DoOnce), as request i of a
// test, and fails t unless the answer is body again.
func echoed(t *testing.T, do func(*fasthttp.Request, *Response, time.Time) error, i int, body string) {
	t.Helper()
	resp, err := postWith(do, body, time.Second)
	defer ReleaseResponse(resp)
	if err != nil || string(resp.Body()) != body {
		t.Fatalf("request #%d: %v, %q, want %q", i+1, err, resp.Body(), body)
	}
}

// TestDoNoContent: a 204 has no body even without Content-Length (RFC 9110
// §15.3.5); reading one would wait for the connection to close.
func TestDoNoContent(t *testing.T) {
	t.Parallel()
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		}
	})
	c := newClient(t, url)
	for range 2 {
		resp, err := post(c, `{}`, 500*time.Millisecond)
		if err != nil || resp.StatusCode() != 204 {
			t.Fatalf("Do = %d, %v; want 204", resp.StatusCode(), err)
		}
		ReleaseResponse(resp)
	}
}

func TestDoRefusedIsNotDelivered(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := newClient(t, "http://"+addr+"/mcp")
	resp, err := post(c, `{}`, time.Second)
	defer ReleaseResponse(resp)
	var ue *Error
	if !errors.As(err, &ue) || ue.Op != "dial" || Delivered(err) {
		t.Fatalf("Do on a closed port = %v (delivered %v), want an undelivered dial error", err, Delivered(err))
	}
}

func TestDoCloseAfterReadIsDelivered(t *testing.T) {
	t.Parallel()
	url := rawServer(t, func(c net.Conn) {
		_, _ = readRequest(bufio.NewReader(c)) // read the request, then die
	})
	c := newClient(t, url)
	resp, err := post(c, `{"method":"tools/call"}`, time.Second)
	defer ReleaseResponse(resp)
	if err == nil || !Delivered(err) || IsTimeout(err) {
		t.Fatalf("Do = %v (delivered %v), want a delivered non-timeout error", err, Delivered(err))
	}
}

func TestDoCloseMidHeader(t *testing.T) {
	t.Parallel()
	url := rawServer(t, func(c net.Conn) {
		_, _ = readRequest(bufio.NewReader(c))
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Ty")
	})
	c := newClient(t, url)
	resp, err := post(c, `{}`, time.Second)
	defer ReleaseResponse(resp)
	if err == nil || !Delivered(err) {
		t.Fatalf("Do = %v, want a delivered error", err)
	}
}

func TestDoHeadDeadline(t *testing.T) {
	t.Parallel()
	url := rawServer(t, func(c net.Conn) {
		_, _ = readRequest(bufio.NewReader(c))
		time.Sleep(2 * time.Second) // hang past the deadline
	})
	c := newClient(t, url)
	start := time.Now()
	resp, err := post(c, `{}`, 100*time.Millisecond)
	defer ReleaseResponse(resp)
	if !IsTimeout(err) || !Delivered(err) {
		t.Fatalf("Do = %v, want a delivered timeout", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("Do took %v, want about 100ms", el)
	}
}

// TestDoStreamOutlivesDeadline: once the head of an SSE answer arrived, the
// stream has no deadline, and events arrive as they are written.
func TestDoStreamOutlivesDeadline(t *testing.T) {
	t.Parallel()
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			for i := range 3 {
				ev := fmt.Sprintf("data: {\"n\":%d}\n\n", i)
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
				time.Sleep(150 * time.Millisecond)
			}
			io.WriteString(c, "0\r\n\r\n")
		}
	})
	c := newClient(t, url)
	for round := range 2 {
		resp, err := post(c, `{}`, 100*time.Millisecond)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !resp.IsStream() {
			t.Fatal("SSE answer not streamed")
		}
		b, err := io.ReadAll(resp)
		if err != nil {
			t.Fatalf("round %d: read stream: %v", round, err)
		}
		if got := strings.Count(string(b), "data: "); got != 3 {
			t.Fatalf("round %d: %d events, want 3: %q", round, got, b)
		}
		ReleaseResponse(resp)
	}
}

func TestDoCloseMidStream(t *testing.T) {
	t.Parallel()
	url := rawServer(t, func(c net.Conn) {
		_, _ = readRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		ev := "data: {}\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
	})
	c := newClient(t, url)
	resp, err := post(c, `{}`, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ReleaseResponse(resp)
	b, err := io.ReadAll(resp)
	if err == nil || string(b) != "data: {}\n\n" {
		t.Fatalf("ReadAll = %q, %v; want the first event then an error", b, err)
	}
}

func TestNewRejectsBadURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "ftp://x/mcp", "http://", "::"} {
		if _, err := New(Config{URL: u}); err == nil {
			t.Errorf("New(%q) = nil error, want one", u)
		}
	}
}

func TestClosedClient(t *testing.T) {
	t.Parallel()
	c, err := New(Config{URL: "http://127.0.0.1:1/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	resp, err := post(c, `{}`, time.Second)
	defer ReleaseResponse(resp)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close = %v, want ErrClosed", err)
	}
}

// TestDoStaleConnectionRetried: for Do (replay-safe requests), a pooled
// connection that idled past staleIdle and is reset when it next carries
// bytes (a NAT that forgot the flow) is replaced by a fresh one, once; a
// connection reused at once that breaks the same way is not (the server may
// have read the request).
func TestDoStaleConnectionRetried(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	resetNext := false
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := readRequest(br)
			if err != nil {
				return
			}
			mu.Lock()
			reset := resetNext
			resetNext = false
			mu.Unlock()
			if reset {
				c.(*net.TCPConn).SetLinger(0)
				return // RST, no answer
			}
			b := req.Body()
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
		}
	})
	c := newClient(t, url)
	call := func() error {
		resp, err := post(c, `{"method":"tools/call"}`, time.Second)
		ReleaseResponse(resp)
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	resetNext = true
	mu.Unlock()
	if err := call(); err == nil || !Delivered(err) { // reused at once: ambiguous, not retried
		t.Fatalf("reset on a just-used connection = %v, want a delivered error", err)
	}
	if err := call(); err != nil { // fresh connection
		t.Fatal(err)
	}
	time.Sleep(staleIdle + 100*time.Millisecond)
	mu.Lock()
	resetNext = true
	mu.Unlock()
	if err := call(); err != nil {
		t.Fatalf("reset on a connection idle %v = %v, want a transparent retry", staleIdle, err)
	}
}

// fakeUpstream is an HTTP/1.1 server on 127.0.0.1 that counts executions:
// every request it read whole, which a real server would have dispatched.
type fakeUpstream struct {
	ln    net.Listener
	url   string
	execs atomic.Int64 // requests read whole
	conns atomic.Int64 // connections accepted
	// die is how many of the next requests are read, counted and left
	// unanswered, the connection closed: a server that ran the tool and died.
	die atomic.Int64
	// cutIdle, when set, closes a connection silently once it idled this
	// long after an answer, as a load balancer does.
	cutIdle time.Duration
}

func newFakeUpstream(t *testing.T, cutIdle time.Duration) *fakeUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f := &fakeUpstream{ln: ln, url: "http://" + ln.Addr().String() + "/mcp", cutIdle: cutIdle}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.conns.Add(1)
			go f.serve(c)
		}
	}()
	return f
}

func (f *fakeUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for answered := false; ; answered = true {
		if f.cutIdle > 0 && answered {
			_ = c.SetReadDeadline(time.Now().Add(f.cutIdle))
		}
		req, err := readRequest(br)
		if err != nil {
			return // closed, or cut for idling
		}
		f.execs.Add(1)
		if n := f.die.Load(); n > 0 && f.die.CompareAndSwap(n, n-1) {
			return
		}
		b := req.Body()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	}
}

// send posts a tools/call through do (c.Do or c.DoOnce) and releases the
// answer.
func send(do func(*fasthttp.Request, *Response, time.Time) error) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`)
	resp := AcquireResponse()
	defer ReleaseResponse(resp)
	return do(req, resp, time.Now().Add(time.Second))
}

func newClientConfig(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestDoHalfClosedPooledConnection: the upstream ended a pooled connection
// with a half close (its FIN, while it still reads: nginx's lingering
// close, Go's closeWriteAndWait) while the connection idled. The next
// exchange on it sees that end at once, as it did before requests waited
// for their answers without a read: past StaleAfter, Do sends again on a
// fresh connection; before it, the exchange fails at once instead of
// waiting out its deadline for an answer that cannot come.
func TestDoHalfClosedPooledConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		staleAfter time.Duration
		idle       time.Duration
		wantResend bool
	}{
		{"past StaleAfter", 150 * time.Millisecond, 300 * time.Millisecond, true},
		{"before StaleAfter", 10 * time.Second, 50 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var conns atomic.Int32
			url := rawServer(t, func(c net.Conn) {
				conns.Add(1)
				br := bufio.NewReader(c)
				if _, err := readRequest(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
				c.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, br) // still reading
			})
			c := newClientConfig(t, Config{URL: url, DialTimeout: time.Second, StaleAfter: tc.staleAfter})
			resp, err := post(c, `{}`, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			ReleaseResponse(resp)
			time.Sleep(tc.idle)
			start := time.Now()
			resp, err = post(c, `{}`, 5*time.Second)
			took := time.Since(start)
			ReleaseResponse(resp)
			if took > 2*time.Second {
				t.Fatalf("the exchange on the half-closed connection took %v (err %v): it waited for an answer that cannot come", took, err)
			}
			if tc.wantResend {
				if err != nil || conns.Load() != 2 {
					t.Fatalf("Do = %v on %d connections; want a resend on a second connection", err, conns.Load())
				}
				return
			}
			var ue *Error
			if !errors.As(err, &ue) || ue.Timeout() || ue.Answered {
				t.Fatalf("Do = %v; want the connection's end reported at once", err)
			}
		})
	}
}

// TestDoOnceSkipsCutIdleConnection: a load balancer closed the pooled
// connection while it idled past Config.StaleAfter. DoOnce never writes on
// it: it dials a fresh connection, and the tool runs once, with no error.
func TestDoOnceSkipsCutIdleConnection(t *testing.T) {
	t.Parallel()
	const after = 300 * time.Millisecond
	up := newFakeUpstream(t, after/3)
	c := newClientConfig(t, Config{URL: up.url, DialTimeout: time.Second, StaleAfter: after})
	if err := send(c.DoOnce); err != nil {
		t.Fatal(err)
	}
	time.Sleep(after + 100*time.Millisecond)
	if err := send(c.DoOnce); err != nil {
		t.Fatalf("DoOnce after the idle connection was cut = %v, want it to go on a fresh connection", err)
	}
	if n := up.execs.Load(); n != 2 {
		t.Errorf("upstream ran %d requests, want 2", n)
	}
	if n := up.conns.Load(); n != 2 {
		t.Errorf("upstream accepted %d connections, want 2 (the cut one replaced)", n)
	}
}

// TestDoOnceSeesPeerClosedIdleConnection: the server closes an idle
// connection well before StaleAfter (a restart, a short keep-alive
// timeout). DoOnce sees the close waiting on the connection and dials a
// fresh one instead of writing a request that would meet EOF and end as
// "may have run".
func TestDoOnceSeesPeerClosedIdleConnection(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t, 20*time.Millisecond)
	c := newClientConfig(t, Config{URL: up.url, DialTimeout: time.Second, StaleAfter: time.Hour})
	for i := range 3 {
		if err := send(c.DoOnce); err != nil {
			t.Fatalf("DoOnce #%d after the server closed the idle connection = %v", i+1, err)
		}
		time.Sleep(80 * time.Millisecond) // the server closes the connection meanwhile
	}
	if n := up.execs.Load(); n != 3 {
		t.Errorf("upstream ran %d requests, want 3", n)
	}
	if n := up.conns.Load(); n != 3 {
		t.Errorf("upstream accepted %d connections, want 3 (each closed one replaced)", n)
	}
}

// TestServerDiesAfterReadOnIdleConnection: the server reads the request,
// runs the tool and dies without answering, on a connection that idled past
// staleIdle. Do (replay-safe) may resend, so the request runs twice; DoOnce
// runs it once and reports it may have been delivered.
func TestServerDiesAfterReadOnIdleConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		once      bool
		wantExecs int64
		wantErr   bool
	}{
		{"Do", false, 2, false},
		{"DoOnce", true, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newFakeUpstream(t, 0)
			c := newClient(t, up.url)
			do := c.Do
			if tc.once {
				do = c.DoOnce
			}
			if err := send(do); err != nil {
				t.Fatal(err)
			}
			time.Sleep(staleIdle + 100*time.Millisecond)
			up.die.Store(1)
			err := send(do)
			if got := up.execs.Load() - 1; got != tc.wantExecs {
				t.Errorf("%s: upstream ran the request %d times, want %d", tc.name, got, tc.wantExecs)
			}
			if (err != nil) != tc.wantErr || err != nil && !Delivered(err) {
				t.Errorf("%s = %v (delivered %v), want error %v, delivered", tc.name, err, Delivered(err), tc.wantErr)
			}
		})
	}
}

// TestResendRefusedIsDelivered: the server read the request on a connection
// that idled past staleIdle and died; Do's resend then finds the port
// closed. The refused dial must not hide that the first try was written:
// Delivered stays true, or the caller would replay a request that ran.
func TestResendRefusedIsDelivered(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t, 0)
	c := newClient(t, up.url)
	if err := send(c.Do); err != nil {
		t.Fatal(err)
	}
	up.ln.Close() // the open connection lives on; new dials are refused
	time.Sleep(staleIdle + 100*time.Millisecond)
	up.die.Store(1)
	err := send(c.Do)
	var ue *Error
	if !errors.As(err, &ue) || !Delivered(err) || NotSent(err) || !ue.Resent {
		t.Fatalf("Do with a refused resend = %v (delivered %v), want a delivered resend error", err, Delivered(err))
	}
	if n := up.execs.Load(); n != 2 {
		t.Errorf("upstream ran %d requests, want 2", n)
	}
}

// TestDoOnceRefusedIsNotSent: DoOnce does not use the connection that idled
// past staleIdle, and the port is closed: nothing was written anywhere, so
// the caller may send the request again whatever its method.
func TestDoOnceRefusedIsNotSent(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t, 0)
	c := newClient(t, up.url)
	if err := send(c.DoOnce); err != nil {
		t.Fatal(err)
	}
	up.ln.Close()
	time.Sleep(staleIdle + 100*time.Millisecond)
	err := send(c.DoOnce)
	if !NotSent(err) || Delivered(err) {
		t.Fatalf("DoOnce with the port closed = %v (delivered %v), want not sent", err, Delivered(err))
	}
	if n := up.execs.Load(); n != 1 {
		t.Errorf("upstream ran %d requests, want 1", n)
	}
}

// TestReusedAtOnceThenDiesIsDelivered: a connection reused at once breaks
// after the write (the server read the request and died). Neither Do nor
// DoOnce resends: the request ran once and may have been delivered.
func TestReusedAtOnceThenDiesIsDelivered(t *testing.T) {
	t.Parallel()
	for _, once := range []bool{false, true} {
		name := "Do"
		if once {
			name = "DoOnce"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			up := newFakeUpstream(t, 0)
			c := newClient(t, up.url)
			do := c.Do
			if once {
				do = c.DoOnce
			}
			if err := send(do); err != nil {
				t.Fatal(err)
			}
			up.die.Store(1)
			err := send(do)
			var ue *Error
			if !errors.As(err, &ue) || !Delivered(err) || !ue.Reused || ue.Resent {
				t.Fatalf("%s = %v (delivered %v), want a delivered error on the reused connection", name, err, Delivered(err))
			}
			if n := up.execs.Load(); n != 2 {
				t.Errorf("upstream ran %d requests, want 2 (one each)", n)
			}
			if n := up.conns.Load(); n != 1 {
				t.Errorf("upstream accepted %d connections, want 1 (no resend)", n)
			}
		})
	}
}

// TestMalformedHeadQuotesNothing: an upstream answering a head that does
// not parse gets an error that quotes none of it (its header values, such
// as an upstream session id, must never reach a log).
func TestMalformedHeadQuotesNothing(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nMcp-Session-Id: UPSTREAM-SECRET-SID\r\nNoColon UPSTREAM-SECRET-HDR\r\n\r\n"))
	}()
	c, err := New(Config{URL: "http://" + ln.Addr().String() + "/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetBodyString(`{}`)
	resp := AcquireResponse()
	defer ReleaseResponse(resp)
	err = c.Do(req, resp, time.Now().Add(5*time.Second))
	if !errors.Is(err, ErrMalformedHead) || strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("err = %v; want ErrMalformedHead quoting nothing of the head", err)
	}
	if !Delivered(err) {
		t.Fatal("the request was written: it may have run")
	}
}

// TestAnswerTooLarge: a JSON answer past MaxResponseBody is a
// TooLargeError naming the limit, not a lost connection.
func TestAnswerTooLarge(t *testing.T) {
	t.Parallel()
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(bytes.Repeat([]byte("x"), 4096))
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown() }()
	c, err := New(Config{URL: "http://" + ln.Addr().String() + "/mcp", MaxResponseBody: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodPost)
	resp := AcquireResponse()
	defer ReleaseResponse(resp)
	err = c.Do(req, resp, time.Now().Add(5*time.Second))
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Limit != 1024 {
		t.Fatalf("err = %v, want a TooLargeError with limit 1024", err)
	}
}

// TestInterimAnswerSkipped: a 100 Continue before the answer is not the
// answer. Taking it for one left the real answer on the pooled connection,
// where the next request (another agent's) read it.
func TestInterimAnswerSkipped(t *testing.T) {
	t.Parallel()
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for n := 1; ; n++ {
			if _, err := readRequest(br); err != nil {
				return
			}
			body := fmt.Sprintf(`{"n":%d}`, n)
			_, _ = io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"+
				"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
		}
	})
	c := newClient(t, url)
	for n := 1; n <= 2; n++ {
		resp, err := post(c, `{}`, time.Second)
		if err != nil || resp.StatusCode() != 200 || string(resp.Body()) != fmt.Sprintf(`{"n":%d}`, n) {
			t.Fatalf("exchange %d: %v %d %q", n, err, resp.StatusCode(), resp.Body())
		}
		ReleaseResponse(resp)
	}
}

// TestCloseClearsStreamState: a Response reused after a stream read to its
// end (attempt.next resets it without ReleaseResponse) does not pool the
// connection of a later stream abandoned mid-way.
func TestCloseClearsStreamState(t *testing.T) {
	t.Parallel()
	r := &Response{eof: true, chunked: true, closeConn: true}
	r.stream = bytes.NewReader(nil)
	var p pool
	r.pool, r.conn = &p, &conn{nc: nopConn{}}
	r.Close()
	if r.eof || r.chunked || r.closeConn {
		t.Fatalf("after Close: eof %v chunked %v closeConn %v", r.eof, r.chunked, r.closeConn)
	}
}

type nopConn struct{ net.Conn }

func (nopConn) Close() error { return nil }

// TestArrived: Arrived waits for more of a stream without reading it. The
// end that comes within the wait is reported at once; one that comes later
// is not, and the stream then reads on whole, with no read deadline left
// behind.
func TestArrived(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("Arrived waits only on Linux; elsewhere it reports what is buffered")
	}
	const ev = "data: {\"n\":1}\n\n"
	endAfter := make(chan time.Duration, 4)
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			time.Sleep(<-endAfter)
			io.WriteString(c, "0\r\n\r\n")
		}
	})
	c := newClient(t, url)
	readEvent := func(resp *Response) {
		t.Helper()
		buf := make([]byte, len(ev))
		if _, err := io.ReadFull(resp, buf); err != nil || string(buf) != ev {
			t.Fatalf("first event: %q, %v", buf, err)
		}
	}
	for _, tc := range []struct {
		end, wait time.Duration
		want      bool
	}{
		{50 * time.Millisecond, 5 * time.Second, true},
		{400 * time.Millisecond, 20 * time.Millisecond, false},
	} {
		endAfter <- tc.end
		resp, err := post(c, `{}`, 5*time.Second)
		if err != nil || !resp.IsStream() {
			t.Fatalf("post: %v, stream %v", err, resp.IsStream())
		}
		readEvent(resp)
		start := time.Now()
		got := resp.Arrived(tc.wait)
		took := time.Since(start)
		if got != tc.want {
			t.Fatalf("end after %v: Arrived(%v) = %v after %v, want %v", tc.end, tc.wait, got, took, tc.want)
		}
		if tc.want && took > tc.end+time.Second || !tc.want && took < tc.wait {
			t.Fatalf("end after %v: Arrived(%v) took %v", tc.end, tc.wait, took)
		}
		if !tc.want && resp.Buffered() != 0 {
			t.Fatalf("Arrived read %d bytes of the stream", resp.Buffered())
		}
		// Whatever it reported, the stream reads to its end: no deadline
		// is left to cut it.
		if rest, err := io.ReadAll(resp); err != nil || len(rest) != 0 {
			t.Fatalf("end after %v: rest %q, %v", tc.end, rest, err)
		}
		ReleaseResponse(resp)
	}
}

// TestReadEnd: a stream whose end comes after the event read is read to
// that end, and its connection serves the next request; a stream that
// stays open is left after wait, and its connection is not pooled.
func TestReadEnd(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	url, conns := countingServer(t, func(c net.Conn, req *fasthttp.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		ev := "data: {\"result\":{}}\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
		if string(req.Body()) == "open" {
			<-hold // the stream stays open: no more requests on this connection
			return false
		}
		time.Sleep(5 * time.Millisecond) // the end, in a write of its own
		io.WriteString(c, "0\r\n\r\n")
		return true
	})
	c := newClient(t, url)
	first := func(body string) *Response {
		t.Helper()
		resp, err := post(c, body, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		var got []byte
		for !strings.Contains(string(got), "\n\n") {
			n, err := resp.Read(buf)
			if got = append(got, buf[:n]...); err != nil {
				t.Fatalf("%s: the event: %q, %v", body, got, err)
			}
		}
		return resp
	}
	for i := range 2 {
		resp := first("end")
		resp.ReadEnd(time.Second, 1<<10)
		ReleaseResponse(resp)
		if n := conns.Load(); n != 1 {
			t.Fatalf("request %d: %d connections, want 1: the stream read to its end leaves its connection pooled", i+1, n)
		}
	}
	resp := first("open")
	start := time.Now()
	resp.ReadEnd(20*time.Millisecond, 1<<10)
	if el := time.Since(start); el > time.Second {
		t.Errorf("ReadEnd of a stream that stays open took %v, want about 20ms", el)
	}
	ReleaseResponse(resp)
	resp = first("end")
	ReleaseResponse(resp)
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: a stream left open takes its connection with it", n)
	}
}
