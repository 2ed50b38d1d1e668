package doctor

import (
	"crypto/rand"
	"fmt"
	"regexp"
	"strings"
)

// Session id shapes for the doctor: what a server's ids look like, and ids
// that look the same but were never issued (an expired session's id).

// IDShape describes a session id without revealing it.
type IDShape struct {
	Length  int
	Prefix  string // a fixed-looking prefix such as "mcp-session-", or ""
	Charset string // "uuid", "hex", "base32", "alphanumeric", "base64url", "base64", "visible ASCII", or "invalid"
}

// String renders the shape, e.g. `48 chars, "mcp-session-" + uuid`.
func (s IDShape) String() string {
	if s.Prefix != "" {
		return fmt.Sprintf("%d chars, %q + %s", s.Length, s.Prefix, s.Charset)
	}
	return fmt.Sprintf("%d chars, %s", s.Length, s.Charset)
}

// lookalike returns an id shaped like id (same prefix, length and
// alphabet) that the server never issued. With no id it returns a UUID,
// which most servers' id check accepts as well-formed.
func lookalike(id string) string {
	if id == "" {
		return newUUID()
	}
	sh := shapeOf(id)
	if sh.Charset == "uuid" {
		return sh.Prefix + newUUID()
	}
	out := []byte(id[len(sh.Prefix):])
	rnd := make([]byte, len(out))
	_, _ = rand.Read(rnd)
	for i, c := range out {
		if alpha := sameClass(c, sh.Charset); alpha != "" {
			out[i] = alpha[int(rnd[i])%len(alpha)]
		} // anything else (separators, padding) stays where it was
	}
	return sh.Prefix + string(out)
}

// sameClass returns the characters that may replace c in an id of the
// given charset without changing its shape: the charset's own alphabet for
// hex and base32, else c's class (digit, lower or upper case letter).
func sameClass(c byte, charset string) string {
	const digits, lower, upper = "0123456789", "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	switch {
	case charset == "hex" && c >= 'a' && c <= 'f':
		return "0123456789abcdef"
	case charset == "hex" && c >= 'A' && c <= 'F':
		return "0123456789ABCDEF"
	case charset == "base32" && c >= 'A' && c <= 'Z':
		return upper
	case charset == "base32":
		return "234567"
	case c >= '0' && c <= '9':
		return digits
	case c >= 'a' && c <= 'z':
		return lower
	case c >= 'A' && c <= 'Z':
		return upper
	}
	return ""
}

// newUUID returns a random RFC 9562 version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// shapeOf describes a session id: length, a fixed-looking prefix, and the
// alphabet of the rest.
func shapeOf(id string) IDShape {
	sh := IDShape{Length: len(id)}
	if n := len(id); n >= 36 && isUUID(id[n-36:]) {
		sh.Prefix, sh.Charset = id[:n-36], "uuid"
		return sh
	}
	sh.Prefix = idPrefix(id)
	sh.Charset = charsetOf(id[len(sh.Prefix):])
	return sh
}

// idPrefix returns a leading word such as "sess_" or "mcp-session-":
// lower case words of two or more letters, each followed by one separator,
// three letters or more in all, with at least 16 characters after it.
func idPrefix(id string) string {
	m := prefixRE.FindString(id)
	if len(id)-len(m) < 16 || len(m)-strings.Count(m, "-")-strings.Count(m, "_")-
		strings.Count(m, ":")-strings.Count(m, ".") < 3 {
		return ""
	}
	return m
}

// prefixRE matches a leading run of words like "mcp-session-" or "sess_".
var prefixRE = regexp.MustCompile(`^(?:[a-z]{2,}[-_:.])+`)

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHex(s[i]) {
				return false
			}
		}
	}
	return true
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// charsetOf names the narrowest alphabet that holds every byte of s.
func charsetOf(s string) string {
	all := func(ok func(c byte) bool) bool {
		for i := 0; i < len(s); i++ {
			if !ok(s[i]) {
				return false
			}
		}
		return s != ""
	}
	alnum := func(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	switch {
	case all(func(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }),
		all(func(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }):
		return "hex"
	case all(func(c byte) bool { return c >= 'A' && c <= 'Z' || c >= '2' && c <= '7' }):
		return "base32"
	case all(alnum):
		return "alphanumeric"
	case all(func(c byte) bool { return alnum(c) || c == '-' || c == '_' }):
		return "base64url"
	case all(func(c byte) bool { return alnum(c) || c == '+' || c == '/' || c == '=' }):
		return "base64"
	case all(func(c byte) bool { return c >= 0x21 && c <= 0x7e }):
		return "visible ASCII"
	}
	return "invalid"
}
