package login

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Loopback is the user's part of a login run from a terminal: a listener
// on a loopback address for the redirect back (RFC 8252 §7.3), and the
// authorization URL printed for the user to open.
//
// Anyone on the host can reach the listener, and a browser asks it for more
// than the redirect (a favicon, an old tab's redirect of an earlier login).
// Only the redirect back of the login in progress, the one whose state is
// that of the URL Authorize printed, ends the wait; every other request is
// answered and ignored, so a stray one cannot end the login.
type Loopback struct {
	// RedirectURL is http://<the listener's address>/callback.
	RedirectURL string
	ln          net.Listener
	srv         *http.Server
	got         chan url.Values // the one redirect back taken; buffered, sent once
	ready       chan struct{}   // closed by Authorize once state is set
	closed      chan struct{}   // closed by Close
	out         io.Writer

	mu    sync.Mutex // protects state and taken
	state string     // the login's state, from the authorization URL
	taken bool       // the redirect back was taken

	readyOnce, closeOnce sync.Once
}

// NewLoopback listens on addr ("127.0.0.1:0": any free port) and prints to
// out. Close it when done.
func NewLoopback(addr string, out io.Writer) (*Loopback, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	lb := &Loopback{RedirectURL: "http://" + ln.Addr().String() + "/callback", ln: ln,
		got: make(chan url.Values, 1), ready: make(chan struct{}), closed: make(chan struct{}), out: out}
	lb.srv = &http.Server{Handler: http.HandlerFunc(lb.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = lb.srv.Serve(ln) }()
	return lb, nil
}

// serve takes the redirect back of the login in progress: a request to
// /callback with its state and a code or an error. Any other path gets
// 404, another state (or none) 400, a redirect without a code or an error
// 400, a second redirect back 409; none of them ends the login. A redirect
// that arrives before Authorize has named the state (a browser quicker
// than the terminal) waits for it.
func (lb *Loopback) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/callback" {
		http.NotFound(w, r)
		return
	}
	select {
	case <-lb.ready:
	case <-lb.closed:
		page(w, http.StatusServiceUnavailable, "mcpheal is no longer waiting for a login here.")
		return
	case <-r.Context().Done():
		return
	}
	q := r.URL.Query()
	lb.mu.Lock()
	mine := q.Get("state") != "" && subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(lb.state)) == 1
	answer := mine && !lb.taken && (q.Get("code") != "" || q.Get("error") != "")
	if answer {
		lb.taken = true
	}
	taken := lb.taken
	lb.mu.Unlock()
	switch {
	case !mine:
		page(w, http.StatusBadRequest, "This is not the redirect back of the login mcpheal is waiting for "+
			"(its state is another login's, or missing), so mcpheal ignored it. If you started mcpheal login "+
			"more than once, open the URL it printed last; mcpheal keeps waiting.")
		return
	case !answer && taken:
		page(w, http.StatusConflict, "This login is already complete; see the terminal.")
		return
	case !answer:
		page(w, http.StatusBadRequest, "This redirect back carries neither an authorization code nor an error, "+
			"so mcpheal ignored it and keeps waiting.")
		return
	}
	lb.got <- q // buffered, and sent once: taken is set
	if q.Get("error") != "" {
		page(w, http.StatusOK, "The login was refused; see the terminal.")
		return
	}
	page(w, http.StatusOK, "mcpheal received the login; you can close this tab.")
}

// page answers with a one-line HTML page.
func page(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html><title>mcpheal</title><p>%s</p>\n", html.EscapeString(msg))
}

// Authorize prints authURL and waits for the redirect back that carries
// authURL's state (or ctx). A Loopback serves one login: call it once.
func (lb *Loopback) Authorize(ctx context.Context, authURL string) (url.Values, error) {
	u, err := url.Parse(authURL)
	if err != nil || u.Query().Get("state") == "" {
		return nil, errors.New("login: the authorization URL carries no state")
	}
	lb.mu.Lock()
	lb.state = u.Query().Get("state")
	lb.mu.Unlock()
	lb.readyOnce.Do(func() { close(lb.ready) })
	fmt.Fprintf(lb.out, "Open this URL in a browser to let mcpheal log in:\n\n  %s\n\nWaiting for the redirect back to %s …\n", authURL, lb.RedirectURL)
	select {
	case q := <-lb.got:
		return q, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, errorf("no redirect back to %s in time: the login was not completed", lb.RedirectURL)
		}
		return nil, ctx.Err()
	}
}

// Close stops the listener. Idempotent.
func (lb *Loopback) Close() {
	lb.closeOnce.Do(func() { close(lb.closed) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = lb.srv.Shutdown(ctx)
}
