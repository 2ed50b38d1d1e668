package upstream

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestInterruptEndsExchange: Interrupt from another goroutine ends an
// exchange waiting for its head (an agent that went away once left it
// open until the response timeout), the upstream sees its connection
// close, the failure says the request was written, and the Response sends
// nothing again until it is released.
func TestInterruptEndsExchange(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	closed := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		if _, err := readRequest(bufio.NewReader(c)); err != nil {
			return
		}
		requests.Add(1)
		_, _ = io.Copy(io.Discard, c) // never answers; returns when the client closes
		close(closed)
	})
	c := newClient(t, url)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod("POST")
	req.SetBodyString(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`)
	resp := AcquireResponse()
	defer ReleaseResponse(resp)
	time.AfterFunc(100*time.Millisecond, resp.Interrupt)
	start := time.Now()
	err := c.DoOnce(req, resp, time.Now().Add(time.Minute))
	if !errors.Is(err, ErrInterrupted) || !Delivered(err) || time.Since(start) > 5*time.Second {
		t.Fatalf("DoOnce = %v (delivered %v) after %v; want ErrInterrupted, delivered, at once", err, Delivered(err), time.Since(start))
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw its connection close")
	}
	for _, do := range []func(*fasthttp.Request, *Response, time.Time) error{c.Do, c.DoOnce} {
		if err := do(req, resp, time.Now().Add(time.Second)); !errors.Is(err, ErrInterrupted) || Delivered(err) {
			t.Fatalf("after Interrupt: %v (delivered %v); want ErrInterrupted, nothing sent", err, Delivered(err))
		}
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests, want 1", n)
	}
}

// TestInterruptEndsStream: Interrupt ends a streamed answer's blocked Read,
// and the connection is not pooled.
func TestInterruptEndsStream(t *testing.T) {
	t.Parallel()
	url := rawServer(t, func(c net.Conn) {
		if _, err := readRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		_, _ = io.Copy(io.Discard, c)
	})
	c := newClient(t, url)
	resp, err := post(c, `{}`, time.Second)
	if err != nil || !resp.IsStream() {
		t.Fatalf("post = %v, stream %v", err, resp.IsStream())
	}
	time.AfterFunc(50*time.Millisecond, resp.Interrupt)
	if _, err := resp.Read(make([]byte, 64)); err == nil {
		t.Fatal("Read after Interrupt: no error")
	}
	ReleaseResponse(resp)
	if n := len(c.pool.idle); n != 0 {
		t.Fatalf("%d idle connections after an interrupted stream, want 0", n)
	}
}

// TestWakeStream: Wake from another goroutine makes a blocked Read of a
// streamed answer return a timeout, TakeWake takes it once, and the stream
// reads on afterwards: the events that come later arrive whole, and the
// connection is pooled when the stream ends. Without a stream Wake reports
// false and leaves the next exchange whole.
func TestWakeStream(t *testing.T) {
	t.Parallel()
	more := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			<-more
			ev := "data: {}\n\n"
			_, _ = io.WriteString(c, strconv.FormatInt(int64(len(ev)), 16)+"\r\n"+ev+"\r\n0\r\n\r\n")
		}
	})
	c := newClient(t, url)
	resp, err := post(c, `{}`, time.Second)
	if err != nil || !resp.IsStream() {
		t.Fatalf("post = %v, stream %v", err, resp.IsStream())
	}
	if resp.TakeWake() {
		t.Fatal("TakeWake before any Wake: true")
	}
	time.AfterFunc(50*time.Millisecond, func() { resp.Wake() })
	if n, err := resp.Read(make([]byte, 64)); n != 0 || !IsTimeout(err) {
		t.Fatalf("Read while woken = %d, %v; want a timeout", n, err)
	}
	if !resp.TakeWake() || resp.TakeWake() {
		t.Fatal("TakeWake after Wake: want true once")
	}
	close(more)
	got, err := io.ReadAll(resp)
	if err != nil || string(got) != "data: {}\n\n" {
		t.Fatalf("the rest of the stream after a wake: %q, %v", got, err)
	}
	resp.Close()
	if n := len(c.pool.idle); n != 1 {
		t.Fatalf("%d idle connections after the stream ended, want 1", n)
	}
	if resp.Wake() { // between exchanges: nothing to wake, no deadline on the pooled connection
		t.Fatal("Wake without a stream: true")
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod("POST")
	req.SetBodyString(`{}`)
	if err := c.Do(req, resp, time.Now().Add(time.Second)); err != nil || !resp.IsStream() {
		t.Fatalf("an exchange after a Wake: %v", err)
	}
	if resp.TakeWake() {
		t.Fatal("a Wake without a stream was remembered")
	}
	got, err = io.ReadAll(resp)
	if err != nil || string(got) != "data: {}\n\n" {
		t.Fatalf("the stream after a Wake between exchanges: %q, %v", got, err)
	}
	ReleaseResponse(resp)
}

// testBudget is a Budget with a limit.
type testBudget struct {
	limit int64
	used  atomic.Int64
}

func (b *testBudget) Take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *testBudget) Give(n int64) { b.used.Add(-n) }

// TestBodyChargedWhileRead: a JSON answer is charged to its Budget as it is
// read, chunked or with a Content-Length, and the charge comes back when
// the Response is released; an answer that would pass the budget stops the
// read with ErrOverBudget (five concurrent chunked 100 MB answers once took
// ~260 MB uncounted), which is no transport failure.
func TestBodyChargedWhileRead(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("x", 1<<20)
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := readRequest(br)
			if err != nil {
				return
			}
			if string(req.Body()) == "chunked" {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
				for i := 0; i < len(body); i += 4096 {
					_, _ = io.WriteString(c, strconv.FormatInt(4096, 16)+"\r\n"+body[i:i+4096]+"\r\n")
				}
				_, _ = io.WriteString(c, "0\r\n\r\n")
				continue
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+
				strconv.Itoa(len(body))+"\r\n\r\n"+body)
		}
	})
	c := newClient(t, url)
	for _, tc := range []struct {
		name  string
		limit int64
		err   error
	}{
		{"chunked", 4 << 20, nil},
		{"length", 4 << 20, nil},
		{"chunked", 1 << 20, ErrOverBudget},
		{"length", 1 << 20, ErrOverBudget},
	} {
		b := &testBudget{limit: tc.limit}
		req := fasthttp.AcquireRequest()
		req.Header.SetMethod("POST")
		req.SetBodyString(tc.name)
		resp := AcquireResponse()
		resp.SetBudget(b)
		err := c.Do(req, resp, time.Now().Add(5*time.Second))
		fasthttp.ReleaseRequest(req)
		if !errors.Is(err, tc.err) {
			t.Fatalf("%s under %d: %v, want %v", tc.name, tc.limit, err, tc.err)
		}
		if tc.err == nil && (len(resp.Body()) != len(body) || b.used.Load() < 2*int64(len(body))) {
			t.Fatalf("%s: read %d bytes, charged %d; want %d charged twice", tc.name, len(resp.Body()), b.used.Load(), len(body))
		}
		if used := b.used.Load(); used > tc.limit {
			t.Fatalf("%s: charged %d past the limit %d", tc.name, used, tc.limit)
		}
		ReleaseResponse(resp)
		if used := b.used.Load(); used != 0 {
			t.Fatalf("%s: %d still charged after release", tc.name, used)
		}
	}
}
