package heal

import (
	"bytes"
	"encoding/base64"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/session/seal"
)

// Credential binding (docs/security.md "Security"). A session is bound to the
// principal that created it: the issuer and subject of a JWT bearer token,
// as MCP's security best practices suggest for user-bound sessions, so
// that a rotated token of the same user keeps the session; for any other
// credential, the credential itself. What is kept is a digest
// (seal.CredentialDigest), the same in every mcpheal process, so that a
// binding recorded by one replica holds on every other.
//
// A request under another principal is a stranger, answered as for an
// unknown session, unless the upstream judges credentials itself (it has
// answered 401 to a refused one): then the request goes upstream as a
// possible rotation of an opaque token, and only once the upstream has
// accepted it does the session move to it, fleet-wide. Until then nothing
// happens on the session for it that the upstream does not judge (no heal,
// no GET stream, no DELETE, no bridged local request). The creator's
// principal stays bound too, so that a stranger with a token the upstream
// accepts can never lock the creator out.

// BindingOf returns the binding digest of an Authorization value; "" for
// none.
func BindingOf(auth []byte) string {
	if len(auth) == 0 {
		return ""
	}
	if p := jwtPrincipal(auth); p != nil {
		return seal.CredentialDigest(p)
	}
	return seal.CredentialDigest(auth)
}

// jwtPrincipal returns "jwt", issuer and subject of a bearer token that is
// a JWT with a subject (RFC 7519 §4.1.1–2), NUL-separated; nil for any
// other credential. The token is not verified: the upstream does that. A
// forged token naming another user's subject is refused by the upstream,
// and holds no session id of theirs.
func jwtPrincipal(auth []byte) []byte {
	const scheme = "Bearer "
	if len(auth) <= len(scheme) || !strings.EqualFold(wire.B2s(auth[:len(scheme)]), scheme) {
		return nil
	}
	tok := auth[len(scheme):]
	first := bytes.IndexByte(tok, '.')
	if first < 0 {
		return nil
	}
	rest := tok[first+1:]
	second := bytes.IndexByte(rest, '.')
	if second < 0 || second > 8<<10 {
		return nil
	}
	payload := make([]byte, base64.RawURLEncoding.DecodedLen(second))
	n, err := base64.RawURLEncoding.Decode(payload, bytes.TrimRight(rest[:second], "="))
	if err != nil {
		return nil
	}
	claims := gjson.ParseBytes(payload[:n])
	sub := claims.Get("sub")
	if sub.Type != gjson.String || sub.Str == "" {
		return nil
	}
	iss := claims.Get("iss").String()
	return []byte("jwt\x00" + iss + "\x00" + sub.Str)
}

// Standing is how a request's credential stands to its session.
type Standing int

const (
	// bound: the session's principal (its creator's, or one it moved to).
	Bound Standing = iota
	// rotating: another principal, which the upstream may accept as a
	// rotated token: the request goes upstream and nothing else.
	Rotating
	// stranger: another principal and nobody to judge it: the request
	// is answered as for an unknown session.
	stranger
)

// StandingOf tells how auth stands to sess, and whether auth is the very
// credential the session's headers hold for its own work (ownCredential: nothing
// to refresh once the upstream accepts the request). It costs a string
// compare when it is (every request but the first after a rotation), and
// a digest otherwise.
func StandingOf(sess *session.Session, auth []byte, judged bool) (st Standing, held bool) {
	cred, hdr := sess.Binding()
	if wire.HeaderValue(hdr, "Authorization") == wire.B2s(auth) {
		if len(auth) > 0 {
			return Bound, true
		}
		held = true
	}
	b := BindingOf(auth)
	switch {
	case b == cred || b == sess.Recipe.Credential:
		return Bound, held
	case judged && len(auth) > 0:
		return Rotating, held
	}
	return stranger, held
}
