package upstream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/oauth2"

	"github.com/mcpheal/mcpheal/upstream/login"
)

// LoginError says that mcpheal holds no usable login for an upstream: the
// token file is missing or unreadable, its access token expired with no
// refresh token, or the authorization server refused the refresh token.
// Only the operator mends it, by running `mcpheal login` again; its message
// says so and never holds a secret.
type LoginError struct {
	File, Server string
	Why          string
	Err          error // the token endpoint's refusal, if that is the cause
}

func (e *LoginError) Error() string {
	server := e.Server
	if server == "" {
		server = "URL"
	}
	return fmt.Sprintf("no usable login in %s (%s); log in again: mcpheal login -token-file %s %s",
		e.File, e.Why, e.File, server)
}

func (e *LoginError) Unwrap() error { return e.Err }

// Refused reports whether err is a refusal that asking again will not mend
// (a token endpoint's 4xx, or a missing login) rather than an outage.
func Refused(err error) bool {
	var te *TokenError
	var le *LoginError
	return errors.As(err, &le) || (errors.As(err, &te) && te.Refused())
}

// LoginCredentials returns Credentials that send the access token of the
// token file at path (a login.File, written by `mcpheal login`), refresh it
// with its refresh token before it expires, and write every token they get
// back to the file, so that a restart, or another replica reading the same
// file, starts from the newest. The file is read again when it changes: a
// new `mcpheal login` takes effect without a restart. Call Close when done.
func LoginCredentials(path string) Credentials {
	f := &loginFile{path: path}
	f.tokenCredentials = newTokenCredentials(f.token)
	return f
}

// loginCheck spaces the checks of the token file for a change.
const loginCheck = time.Second

type loginFile struct {
	*tokenCredentials
	path    string
	checked atomic.Int64 // unix nanoseconds of the last look at the file's mtime
	mu      sync.Mutex   // protects mtime, sent
	mtime   time.Time    // of the file when it was last read or written
	sent    string       // the access token last handed out
}

// Apply looks for a new login at most once a second; one that appeared
// ends a hold-down and replaces the token in use.
func (f *loginFile) Apply(ctx context.Context, h *fasthttp.RequestHeader) error {
	now := time.Now().UnixNano()
	if last := f.checked.Load(); now-last > int64(loginCheck) && f.checked.CompareAndSwap(last, now) {
		if st, err := os.Stat(f.path); err == nil {
			f.mu.Lock()
			changed := !st.ModTime().Equal(f.mtime)
			f.mu.Unlock()
			if changed {
				f.renew()
			}
		}
	}
	return f.tokenCredentials.Apply(ctx, h)
}

// token is the fetch: the file's access token if it is new and good,
// else a refresh, written back to the file.
func (f *loginFile) token(ctx context.Context) (*oauth2.Token, error) {
	l, err := login.Read(f.path)
	if err != nil {
		why := "cannot read it"
		if errors.Is(err, os.ErrNotExist) {
			why = "no such file: mcpheal has not logged in"
		}
		return nil, &LoginError{File: f.path, Why: why}
	}
	f.noteRead()
	f.mu.Lock()
	sent := f.sent
	f.mu.Unlock()
	fresh := l.Expiry.IsZero() || time.Until(l.Expiry) > expirySkew
	if l.AccessToken != "" && l.AccessToken != sent && fresh {
		return f.hand(l.Token())
	}
	if l.RefreshToken == "" {
		return nil, &LoginError{File: f.path, Server: l.Server, Why: "its access token is used up and it holds no refresh token"}
	}
	t, err := l.OAuthConfig().TokenSource(login.ResourceParam(ctx, l.Resource), &oauth2.Token{RefreshToken: l.RefreshToken}).Token()
	if err != nil {
		err = tokenErr(err)
		if Refused(err) {
			return nil, &LoginError{File: f.path, Server: l.Server, Why: "the authorization server refused its refresh token: " + err.Error(), Err: err}
		}
		return nil, err
	}
	l.AccessToken, l.TokenType, l.Expiry = t.AccessToken, t.TokenType, t.Expiry
	if t.RefreshToken != "" {
		l.RefreshToken = t.RefreshToken
	}
	if err := login.Write(f.path, l); err != nil {
		// The token is good for this process; a restart will refresh again
		// (and lose a rotated refresh token: say so where it is seen).
		return nil, fmt.Errorf("refreshed, but cannot write %s: %w", f.path, err)
	}
	f.noteRead()
	return f.hand(t)
}

// hand records t as the token handed out.
func (f *loginFile) hand(t *oauth2.Token) (*oauth2.Token, error) {
	f.mu.Lock()
	f.sent = t.AccessToken
	f.mu.Unlock()
	return t, nil
}

// noteRead remembers the file's mtime as seen now.
func (f *loginFile) noteRead() {
	if st, err := os.Stat(f.path); err == nil {
		f.mu.Lock()
		f.mtime = st.ModTime()
		f.mu.Unlock()
	}
}

// renew drops the token in use and any hold-down after the file changed
// under a login that is not this process's own write.
func (f *loginFile) renew() {
	c := f.tokenCredentials
	c.mu.Lock()
	c.value = ""
	c.refreshAt, c.staleAt, c.retryAt = time.Time{}, time.Time{}, time.Time{}
	c.refusal, c.heldUntil = nil, time.Time{}
	c.mu.Unlock()
	f.mu.Lock()
	f.sent = ""
	f.mu.Unlock()
}
