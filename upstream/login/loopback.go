package login

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// Loopback is the user's part of a login run from a terminal: a listener
// on a loopback address for the redirect back (RFC 8252 §7.3), and the
// authorization URL printed for the user to open.
type Loopback struct {
	// RedirectURL is http://<the listener's address>/callback.
	RedirectURL string
	ln          net.Listener
	srv         *http.Server
	got         chan url.Values
	out         io.Writer
}

// NewLoopback listens on addr ("127.0.0.1:0": any free port) and prints to
// out. Close it when done.
func NewLoopback(addr string, out io.Writer) (*Loopback, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	lb := &Loopback{RedirectURL: "http://" + ln.Addr().String() + "/callback", ln: ln,
		got: make(chan url.Values, 1), out: out}
	lb.srv = &http.Server{Handler: http.HandlerFunc(lb.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = lb.srv.Serve(ln) }()
	return lb, nil
}

// serve takes the first redirect back that carries a code or an error;
// anything else (a browser's favicon request) gets 404.
func (lb *Loopback) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.URL.Path != "/callback" || (q.Get("code") == "" && q.Get("error") == "") {
		http.NotFound(w, r)
		return
	}
	select {
	case lb.got <- q:
	default:
		http.Error(w, "this login is already complete", http.StatusConflict)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if q.Get("error") != "" {
		fmt.Fprint(w, "<!doctype html><title>mcpheal</title><p>The login was refused; see the terminal.</p>\n")
		return
	}
	fmt.Fprint(w, "<!doctype html><title>mcpheal</title><p>mcpheal received the login; you can close this tab.</p>\n")
}

// Authorize prints authURL and waits for the redirect back (or ctx).
func (lb *Loopback) Authorize(ctx context.Context, authURL string) (url.Values, error) {
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

// Close stops the listener.
func (lb *Loopback) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = lb.srv.Shutdown(ctx)
}
