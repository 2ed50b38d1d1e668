package upstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
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
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	resp := AcquireResponse()
	err := c.Do(req, resp, time.Now().Add(d))
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

// TestDoStaleConnectionRetried: a pooled connection that idled past
// staleIdle and is reset when it next carries bytes (a NAT that forgot the
// flow) is replaced by a fresh one, once, whatever the method; a connection
// reused at once that breaks the same way is not (the server may have read
// the request).
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
