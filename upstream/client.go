package upstream

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// Config configures a Client. Zero values take the documented defaults.
type Config struct {
	// URL is the MCP endpoint, http or https (e.g. http://127.0.0.1:3000/mcp).
	URL string
	// DialTimeout bounds connection setup; zero means 5 s.
	DialTimeout time.Duration
	// MaxIdleConn is how long an idle pooled connection may wait for reuse
	// before it is closed instead; zero means 30 s, well under common load
	// balancer and NAT idle limits (60–350 s).
	MaxIdleConn time.Duration
	// MaxIdleConns caps the pool; zero means 512.
	MaxIdleConns int
	// MaxResponseBody caps a JSON (non-streamed) answer; zero means 32 MiB.
	MaxResponseBody int
	// StaleAfter is how long a pooled connection may idle before its peer is
	// in doubt (a NAT or load balancer may have dropped the flow); zero means
	// 1 s. DoOnce does not use such a connection, and Do sends once more on a
	// fresh connection when one breaks before answering.
	StaleAfter time.Duration
}

// Client sends requests to one upstream MCP endpoint.
type Client struct {
	host    string // Host header the upstream expects
	path    []byte // request URI sent upstream (path and query)
	origin  string // scheme://host, for messages
	maxBody int
	pool    pool
	stop    chan struct{} // closed by Close: ends the reaper
	once    sync.Once
	reaped  sync.WaitGroup
}

// New validates cfg and returns a Client. It dials nothing.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("upstream url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("upstream url %q: want http://host[:port]/path or https://…", cfg.URL)
	}
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	path := u.RequestURI()
	c := &Client{
		host:    u.Host,
		path:    []byte(path),
		origin:  u.Scheme + "://" + u.Host,
		maxBody: orInt(cfg.MaxResponseBody, 32<<20),
	}
	c.pool = pool{
		dialer:     net.Dialer{Timeout: orDur(cfg.DialTimeout, 5*time.Second), KeepAlive: 15 * time.Second},
		addr:       addr,
		maxIdle:    orDur(cfg.MaxIdleConn, 30*time.Second),
		maxConns:   orInt(cfg.MaxIdleConns, 512),
		staleAfter: orDur(cfg.StaleAfter, staleIdle),
	}
	if u.Scheme == "https" {
		c.pool.tls = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	}
	c.stop = make(chan struct{})
	c.reaped.Add(1)
	go c.reaper()
	return c, nil
}

// reaper closes connections idle past MaxIdleConn until Close.
func (c *Client) reaper() {
	defer c.reaped.Done()
	t := time.NewTicker(max(c.pool.maxIdle/2, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.pool.reap(now)
		}
	}
}

// Host returns the upstream's host[:port], the Host header it is sent.
func (c *Client) Host() string { return c.host }

// Path returns the path of the upstream's MCP endpoint.
func (c *Client) Path() string {
	p := string(c.path)
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	return p
}

// Origin returns scheme://host[:port] of the upstream.
func (c *Client) Origin() string { return c.origin }

// Probe reports whether a new TCP (and TLS) connection to the upstream can
// be made by deadline. It sends nothing.
func (c *Client) Probe(deadline time.Time) error {
	cn, err := c.pool.dial(deadline)
	if err != nil {
		return err
	}
	_ = cn.nc.Close()
	return nil
}

// Close closes every connection, cutting exchanges in flight, and refuses
// further requests.
func (c *Client) Close() {
	c.once.Do(func() { close(c.stop) })
	c.reaped.Wait()
	c.pool.closeIdle(true)
}

// Do sends req to the upstream endpoint and reads the response head into resp
// before deadline. req's URI and Host are set here; the caller sets method,
// headers and body. A JSON answer is read whole; a text/event-stream answer is
// left streaming: read it with resp.Read. In both cases the caller must call
// resp.Close (ReleaseResponse does).
//
// Do is for requests that are safe to send twice (docs/healing.md "Replay rules"):
// when the first try breaks before any response byte on a pooled connection
// that idled Config.StaleAfter or longer, Do sends req once more on a fresh
// connection. The likely cause is a NAT or load balancer that dropped the
// idle flow, but the server may also have read the request and died, so a
// request that must not run twice goes through DoOnce.
//
// A failure is an *Error saying whether the request may have been delivered
// (Delivered); after a failed resend it still counts the first try's bytes.
func (c *Client) Do(req *fasthttp.Request, resp *Response, deadline time.Time) error {
	req.SetRequestURIBytes(c.path)
	return c.do(req, resp, deadline, true)
}

// DoOnce is Do for a request that must not run twice, such as a tools/call
// with side effects: it sends req at most once. It never resends, and it does
// not put req on a pooled connection that idled Config.StaleAfter or longer,
// whose peer may be gone: it closes that connection and dials a fresh one, so
// a flow that a middlebox dropped while idle costs a dial, not an ambiguous
// failure. (Go's net/http transport likewise never resends a written
// non-idempotent request.)
//
// A failure is an *Error as for Do. When Delivered reports true, the request
// may have run, and DoOnce has not sent it again.
func (c *Client) DoOnce(req *fasthttp.Request, resp *Response, deadline time.Time) error {
	req.SetRequestURIBytes(c.path)
	return c.do(req, resp, deadline, false)
}

// DoPath is Do for another path on the upstream's origin (OAuth discovery
// documents live beside the MCP endpoint). Like Do, it is for replay-safe
// requests only.
func (c *Client) DoPath(req *fasthttp.Request, resp *Response, path string, deadline time.Time) error {
	req.SetRequestURI(path)
	return c.do(req, resp, deadline, true)
}

// do runs one exchange. Only a replaySafe request is sent again after a
// failure on a stale connection; any other gets a connection whose liveness
// is not in doubt, and is never sent again even if that connection crossed
// StaleAfter between get and the failure.
func (c *Client) do(req *fasthttp.Request, resp *Response, deadline time.Time, replaySafe bool) error {
	req.Header.SetHost(c.host)
	if resp.interrupted() {
		return &Error{Op: "write", Err: ErrInterrupted}
	}
	cn, err := c.pool.get(deadline, !replaySafe)
	if err != nil {
		return err
	}
	err = c.exchange(cn, req, resp, deadline)
	if !replaySafe || resp.interrupted() || !stale(err, c.pool.staleAfter) {
		return err
	}
	return c.resend(req, resp, deadline, err)
}

// resend sends a replay-safe req once more on a fresh connection after first,
// its failure on a stale one (docs/healing.md "Keeping upstream healthy"). If the
// second try fails too, its error keeps the first try's evidence.
func (c *Client) resend(req *fasthttp.Request, resp *Response, deadline time.Time, first error) error {
	resp.Reset()
	cn, err := c.pool.dial(deadline)
	if err == nil && !c.pool.track(cn) {
		_ = cn.nc.Close()
		err = ErrClosed
	}
	if err == nil {
		err = c.exchange(cn, req, resp, deadline)
	}
	if err != nil {
		return resent(err, first)
	}
	return nil
}

func (c *Client) exchange(cn *conn, req *fasthttp.Request, resp *Response, deadline time.Time) error {
	reused := cn.uses > 0
	var idle time.Duration
	if reused {
		idle = time.Since(cn.idleSince)
	}
	cn.uses++
	cn.written, cn.read, cn.sawEOF, cn.overBudget = 0, 0, false, false
	resp.giveBack() // the body of an earlier exchange on resp is gone
	fail := func(op string, err error) error {
		if !resp.live.CompareAndSwap(cn, nil) {
			err = ErrInterrupted // what failed was Interrupt closing the connection
		}
		c.pool.discard(cn)
		return &Error{Op: op, Written: cn.written > 0, Reused: reused, Idle: idle, Answered: cn.read > 0, Err: err}
	}
	if !resp.live.CompareAndSwap(nil, cn) {
		return fail("write", ErrInterrupted) // interrupted before the first byte
	}
	if err := cn.nc.SetDeadline(deadline); err != nil {
		return fail("write", err)
	}
	if err := req.Write(cn.bw); err != nil {
		return fail("write", err)
	}
	if err := cn.bw.Flush(); err != nil {
		return fail("write", err)
	}
	bigHead, err := readHead(cn, resp)
	if err != nil {
		return fail("read", err)
	}
	closeConn := req.Header.ConnectionClose() || resp.Header.ConnectionClose() || bigHead
	if isEventStream(resp.Header.ContentType()) && hasBody(resp.StatusCode()) {
		resp.StreamBody = true
		if err := resp.ReadBody(cn.br, 0); err != nil {
			return fail("read", err)
		}
		// The head arrived in time; the stream itself has no deadline.
		if err := cn.nc.SetReadDeadline(time.Time{}); err != nil {
			return fail("read", err)
		}
		resp.stream = resp.BodyStream()
		resp.wakeMu.Lock()
		resp.streaming = cn
		resp.wakeMu.Unlock()
		resp.chunked = resp.Header.ContentLength() == -1
		if resp.Header.ContentLength() == -2 {
			closeConn = true // the body ends when the connection does
		}
		// The stream keeps its connection in resp.live until Close, so that
		// Interrupt can still cut it.
		resp.conn, resp.pool, resp.closeConn = cn, &c.pool, closeConn
		return nil
	}
	if hasBody(resp.StatusCode()) {
		if err := c.readBody(cn, resp); err != nil {
			return fail("read", err)
		}
		// A chunked body ends with its trailer section, if only the empty
		// line, which ReadBody leaves in the reader (fasthttp's
		// Response.Read reads it after). Left there, it would look like
		// bytes the server sent unasked, and the next request that must
		// not run twice would give up the connection; a trailer field would
		// be read as the next answer's status line. The answer is whole
		// without it: a trailer that does not end well (the server closed
		// before its empty line, a field fasthttp refuses) costs the
		// connection, not the answer.
		if resp.Header.ContentLength() == -1 && resp.Header.ReadTrailer(cn.br) != nil {
			closeConn = true
		}
	}
	if !resp.live.CompareAndSwap(cn, nil) {
		return fail("read", ErrInterrupted) // whole, but its caller has given up on it
	}
	if closeConn {
		c.pool.discard(cn)
	} else {
		c.pool.put(cn)
	}
	return nil
}

// readBody reads a JSON answer whole, charging resp's Budget (if it has
// one) twice the body's size: fasthttp allocates a Content-Length body at
// once, rounded up to a power of two, and grows a chunked one by doubling,
// so its buffer holds up to twice what it has read. A body with a
// Content-Length is charged before its first byte; one without (chunked, or
// ended by the close) as its bytes arrive. Past the budget the read stops
// with ErrOverBudget.
func (c *Client) readBody(cn *conn, resp *Response) error {
	limit := c.maxBody
	if resp.max > 0 {
		limit = min(limit, resp.max)
	}
	if cl := resp.Header.ContentLength(); resp.budget != nil && cl <= limit {
		n := cl
		if cl < 0 {
			n = cn.br.Buffered() // read with the head; the rest is metered
			cn.meter = resp
		}
		if !resp.charge(n) {
			cn.meter = nil
			return ErrOverBudget
		}
	}
	err := resp.ReadBody(cn.br, limit)
	cn.meter = nil
	switch {
	case cn.overBudget:
		return ErrOverBudget
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return &TooLargeError{Limit: limit}
	}
	return err
}

// TooLargeError is the error of a JSON answer larger than
// Config.MaxResponseBody. The upstream answered: it is no transport death.
type TooLargeError struct{ Limit int }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("answer larger than the %d-byte limit", e.Limit)
}

// ErrMalformedHead is the error of an answer whose head could not be
// parsed.
var ErrMalformedHead = errors.New("malformed response head")

// readHead reads the answer's head, past interim answers. bigHead reports
// that it was longer than the pooled read buffer and was read through a
// larger reader, which the connection now holds: it is not to be pooled
// again.
func readHead(cn *conn, resp *Response) (bigHead bool, err error) {
	for {
		err := resp.Header.Read(cn.br)
		if err != nil && !bigHead && smallBuffer(err) {
			// A head larger than the pooled read buffer (a header far
			// longer than servers send, such as a 100 KB Mcp-Session-Id):
			// nothing of it was consumed, so it is read again through a
			// reader of maxHead, and the caller sees the answer for what
			// it is instead of a broken connection.
			cn.br, bigHead = bufio.NewReaderSize(cn.br, maxHead), true
			resp.Header.Reset()
			err = resp.Header.Read(cn.br)
		}
		if err != nil {
			switch {
			case smallBuffer(err):
				err = ErrHeadTooLarge
			case errors.Is(err, io.EOF):
				err = io.ErrUnexpectedEOF
			}
			return bigHead, headError(err)
		}
		// An interim answer (100 Continue, 103 Early Hints) comes before
		// the real one: taking it for the answer would leave the real one
		// on the connection for the next request, another agent's.
		if st := resp.Header.StatusCode(); st < 100 || st >= 200 || st == fasthttp.StatusSwitchingProtocols {
			return bigHead, nil
		}
		resp.Header.Reset()
	}
}

// smallBuffer reports fasthttp's error for a head larger than its reader's
// buffer.
func smallBuffer(err error) bool {
	var small *fasthttp.ErrSmallBuffer
	return errors.As(err, &small)
}

// ErrHeadTooLarge is the error of an answer whose head is larger than
// maxHead. The upstream answered: like TooLargeError, it is no transport
// death, and sending again would meet the same answer.
var ErrHeadTooLarge = errors.New("response head larger than 1 MiB")

// maxHead caps an answer's head (the limit of Go's net/http server,
// DefaultMaxHeaderBytes): the pooled read buffer holds 16 KiB, and a
// longer head is read once more through a reader this large.
const maxHead = 1 << 20

// headError keeps what a network error says and drops what fasthttp's
// parse errors quote of the head itself: header values such as an upstream
// Mcp-Session-Id or a cookie, which must never reach a log.
func headError(err error) error {
	var ne net.Error
	if IsTimeout(err) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrHeadTooLarge) {
		return err
	}
	return ErrMalformedHead
}

// hasBody reports whether a response with this status may carry a body
// (RFC 9110 §6.4.1: not 1xx, 204 or 304).
func hasBody(status int) bool {
	return status >= 200 && status != fasthttp.StatusNoContent && status != fasthttp.StatusNotModified
}

func isEventStream(ct []byte) bool {
	const sse = "text/event-stream"
	return len(ct) >= len(sse) && strings.EqualFold(b2s(ct[:len(sse)]), sse)
}

// Response is an upstream answer. For a streamed answer the body is read with
// Read; otherwise Body() holds it.
type Response struct {
	fasthttp.Response

	stream    io.Reader
	chunked   bool
	eof       bool
	got       int64 // bytes of the streamed body read so far
	conn      *conn
	pool      *pool
	closeConn bool

	// live is the connection of the exchange in flight, or of the
	// streamed answer, so that Interrupt can close it from another
	// goroutine; interruptedConn once Interrupt ran. Whoever swaps a
	// connection out of live owns its fate: the exchange pools it only
	// if it takes it back itself.
	live atomic.Pointer[conn]

	budget Budget // charged for the body (SetBudget); nil: not counted
	held   int64  // taken from budget for the current body
	max    int    // caps a JSON body below Config.MaxResponseBody (SetMaxBody); 0: no cap of its own

	// wakeMu guards woken (Wake ran, its reader has not taken it) and
	// streaming (the streamed answer's connection until Close), so that
	// Wake never sets a deadline on a connection another exchange uses.
	wakeMu    sync.Mutex
	woken     atomic.Bool // read without wakeMu: TakeWake costs a load when nothing woke r
	streaming *conn
}

// Budget is memory shared with other users (mcpheal's memory_budget) that
// an answer's body is charged to while it is read and held.
type Budget interface {
	// Take reserves n bytes; false when that would pass the limit.
	Take(n int64) bool
	// Give returns n bytes taken before.
	Give(n int64)
}

// SetBudget makes the JSON answers read into r count against b, from their
// first byte until r is released or sent again (see Client.Do).
func (r *Response) SetBudget(b Budget) { r.budget = b }

// SetMaxBody caps the JSON answers read into r at n bytes, below the
// client's Config.MaxResponseBody (an answer that is small by its nature,
// such as an OAuth metadata document); zero means the client's cap.
func (r *Response) SetMaxBody(n int) { r.max = n }

// charge takes twice n bytes from r's budget for its body (see readBody).
func (r *Response) charge(n int) bool {
	k := 2 * int64(n)
	if !r.budget.Take(k) {
		return false
	}
	r.held += k
	return true
}

// giveBack returns what r's body was charged.
func (r *Response) giveBack() {
	if r.held > 0 {
		r.budget.Give(r.held)
		r.held = 0
	}
}

// interruptedConn marks a Response that Interrupt ran on.
var interruptedConn = new(conn)

// interrupted reports whether Interrupt ran on r since it was acquired.
func (r *Response) interrupted() bool { return r.live.Load() == interruptedConn }

var responsePool = sync.Pool{New: func() any { return new(Response) }}

// AcquireResponse returns an empty Response from a pool.
func AcquireResponse() *Response { return responsePool.Get().(*Response) }

// ReleaseResponse closes r and returns it to the pool. r must not be used
// afterwards.
func ReleaseResponse(r *Response) {
	r.Close()
	r.Response.Reset()
	r.giveBack()
	r.eof, r.chunked, r.got, r.budget, r.max = false, false, 0, nil, 0
	r.live.Store(nil)
	r.woken.Store(false)
	responsePool.Put(r)
}

// IsStream reports whether the body is being streamed (text/event-stream).
func (r *Response) IsStream() bool { return r.stream != nil }

// Read reads the streamed body.
func (r *Response) Read(p []byte) (int, error) {
	if r.stream == nil {
		return 0, io.EOF
	}
	n, err := r.stream.Read(p)
	r.got += int64(n)
	if errors.Is(err, io.EOF) {
		// fasthttp reports a chunked body cut at a chunk boundary as a clean
		// EOF; only the terminating zero-length chunk is one.
		if r.chunked && r.conn.sawEOF {
			return n, io.ErrUnexpectedEOF
		}
		r.eof = true
	}
	return n, err
}

// SetReadDeadline bounds the next reads of a streamed answer; the zero time
// removes the bound.
func (r *Response) SetReadDeadline(t time.Time) error {
	if r.conn == nil {
		return ErrClosed
	}
	return r.conn.nc.SetReadDeadline(t)
}

// Interrupt ends, from another goroutine, what r is waiting on: the
// exchange in flight (Do, DoOnce: it fails with ErrInterrupted, whatever
// it had written) or the streamed answer (a blocked Read returns). It closes
// that connection, and every later exchange on r fails at once with
// ErrInterrupted, sending nothing, until r is released: a caller that gave
// up (its agent went away) never has its request sent again. It is safe to
// call concurrently with Do and Read; Close must still be called by the
// reader.
func (r *Response) Interrupt() {
	cn := r.live.Swap(interruptedConn)
	if cn == nil || cn == interruptedConn {
		return
	}
	nc := cn.nc
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn() // tls.Conn.Close would wait for a write in flight
	}
	_ = nc.Close()
}

// Wake makes the reader of r's streamed answer look up, from another
// goroutine: a Read blocked now returns at once with a timeout error
// (IsTimeout), and TakeWake reports true until the reader has taken it. It
// reports false, and remembers nothing, when r has no streamed answer (an
// exchange waiting for its head is never cut).
func (r *Response) Wake() bool {
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	if r.streaming == nil {
		return false
	}
	r.woken.Store(true)
	_ = r.streaming.nc.SetReadDeadline(time.Now())
	return true
}

// Woken reports whether Wake ran since the last TakeWake, and leaves it.
func (r *Response) Woken() bool { return r.woken.Load() }

// TakeWake reports whether Wake ran since the last TakeWake, and takes
// it: the stream's reads have no deadline again.
func (r *Response) TakeWake() bool {
	if !r.woken.Load() {
		return false
	}
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	if !r.woken.Swap(false) {
		return false
	}
	if r.streaming != nil {
		_ = r.streaming.nc.SetReadDeadline(time.Time{})
	}
	return true
}

// ReadEnd reads what is left of a streamed answer and drops it, if the
// stream ends within wait (a server ends an answer's stream right after its
// response): a stream read to its end leaves its connection to the pool at
// Close, where one closed unread costs a new connection. It reads at most
// max bytes; a stream that goes on past wait or max is left for Close to
// drop with its connection, as before. An answer that is not a stream, was
// read to its end, or whose connection closes after it costs nothing.
func (r *Response) ReadEnd(wait time.Duration, max int) {
	if r.stream == nil || r.eof || r.closeConn || r.conn.nc.SetReadDeadline(time.Now().Add(wait)) != nil {
		return
	}
	buf := endBufs.Get().(*[4 << 10]byte)
	defer endBufs.Put(buf)
	for got := 0; got < max; {
		n, err := r.Read(buf[:])
		if err != nil {
			return // io.EOF: read to its end
		}
		got += n
	}
}

// endBufs are ReadEnd's buffers: what it reads is dropped.
var endBufs = sync.Pool{New: func() any { return new([4 << 10]byte) }}

// Close ends a streamed answer. The connection is pooled again only if the
// stream was read to its end.
func (r *Response) Close() {
	if r.stream == nil {
		return
	}
	_ = r.CloseBodyStream()
	r.stream = nil
	r.wakeMu.Lock()
	r.streaming = nil
	r.wakeMu.Unlock()
	if r.live.CompareAndSwap(r.conn, nil) && r.eof && !r.closeConn {
		r.pool.put(r.conn)
	} else {
		r.pool.discard(r.conn)
	}
	// Whatever the next exchange on this Response is, it starts clean: a
	// stale eof would pool a connection with its stream unread.
	r.conn, r.pool, r.eof, r.chunked, r.closeConn, r.got = nil, nil, false, false, false, 0
}

// Buffered reports how many bytes of a streamed answer have arrived and
// wait to be read: reading no more than that never blocks.
func (r *Response) Buffered() int {
	if r.conn == nil {
		return 0
	}
	return r.conn.br.Buffered()
}

// Arrived reports whether more of a streamed answer is here to read, waiting
// up to wait for it to arrive; it reads nothing and sets no deadline. After
// it reports true the next Read finds bytes, the end of the stream, or an
// error without waiting for the peer (it may wait for the rest of a chunk
// that arrived in part). It waits only on Linux, and not over TLS;
// elsewhere it reports what is buffered.
func (r *Response) Arrived(wait time.Duration) bool {
	switch {
	case r.conn == nil:
		return false
	case r.Buffered() > 0 || r.Complete():
		return true
	}
	return r.conn.wait.readable(wait)
}

// Complete reports whether a streamed answer with a Content-Length has
// been read whole: the next Read returns io.EOF without waiting.
func (r *Response) Complete() bool {
	cl := r.Header.ContentLength()
	return r.stream != nil && cl >= 0 && r.got >= int64(cl)
}

func orDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func orInt(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// b2s views b as a string without copying; b must not change while the
// string is in use.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
