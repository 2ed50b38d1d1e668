package classify

import (
	"math/bits"
	"strings"
	"unsafe"
)

// bom is the UTF-8 byte order mark. Some Windows-hosted servers and proxies
// put it before a JSON body; the SSE spec (HTML Living Standard §9.2.6)
// strips one at the start of a stream.
const bom = "\xEF\xBB\xBF"

// b2s views b as a string without copying. The string is valid only while b
// is unchanged; Classify never lets one escape the call.
func b2s(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// s2b views s as a byte slice without copying, for the line helpers of
// package sse, which only read it. It must never be written to.
func s2b(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// trimLeft drops every leading byte order mark and ASCII whitespace byte.
// Repeating both keeps Classify invariant under either prefix, whatever the
// body already starts with.
func trimLeft(s string) string {
	for {
		switch {
		case strings.HasPrefix(s, bom):
			s = s[len(bom):]
		case s != "" && isSpace(s[0]):
			s = s[1:]
		default:
			return s
		}
	}
}

// lower returns the ASCII lower case of c. Non-ASCII bytes are unchanged, so
// multi-byte UTF-8 never folds into an ASCII marker.
func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

// hasPrefixFold reports whether s starts with the lower-case ASCII prefix,
// ignoring ASCII case in s.
func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		if lower(s[i]) != prefix[i] {
			return false
		}
	}
	return true
}

// foldSet finds any of up to 8 lower-case ASCII phrases in one pass over the
// text, ignoring ASCII case. It is built once at package init and only read
// afterwards.
type foldSet struct {
	phrases []string
	first   [256]uint8 // bit j is set for both cases of phrases[j][0]
}

func newFoldSet(phrases ...string) *foldSet {
	if len(phrases) > 8 {
		panic("classify: foldSet holds at most 8 phrases")
	}
	fs := &foldSet{phrases: phrases}
	for j, p := range phrases {
		if p == "" || !isLowerASCII(p) {
			panic("classify: foldSet phrases must be non-empty lower-case ASCII: " + p)
		}
		fs.first[p[0]] |= 1 << j
		if 'a' <= p[0] && p[0] <= 'z' {
			fs.first[p[0]-('a'-'A')] |= 1 << j
		}
	}
	return fs
}

// in reports whether s contains one of the phrases anywhere, even inside a
// word.
func (fs *foldSet) in(s string) bool {
	for i := 0; i < len(s); i++ {
		for m := fs.first[s[i]]; m != 0; m &= m - 1 {
			if hasPrefixFold(s[i:], fs.phrases[bits.TrailingZeros8(m)]) {
				return true
			}
		}
	}
	return false
}

// wholeSet holds whole messages, each lower-case ASCII with no surrounding
// whitespace and no trailing period. It is built once at package init and
// only read afterwards.
type wholeSet []string

func newWholeSet(messages ...string) wholeSet {
	for _, m := range messages {
		if m == "" || m != trimMessage(m) || !isLowerASCII(m) {
			panic("classify: wholeSet messages must be trimmed lower-case ASCII without a trailing period: " + m)
		}
	}
	return wholeSet(messages)
}

// is reports whether text is one of the messages as a whole, ignoring ASCII
// case, surrounding whitespace and one trailing period. Nothing else may
// come before or after it: "charged $20 but payment gateway session
// expired" is not "session expired". text may be raw JSON string text.
func (ws wholeSet) is(text string) bool {
	text = trimMessage(text)
	for _, m := range ws {
		if len(m) == len(text) && hasPrefixFold(text, m) {
			return true
		}
	}
	return false
}

// trimMessage drops surrounding ASCII whitespace, raw or JSON-escaped (\n,
// \r, \t), then one trailing period. A trailing escape is dropped even when
// its backslash is itself escaped ("\\n"); what remains then ends in a
// backslash, which no message does, so the mistake cannot make a match.
func trimMessage(s string) string {
	for {
		switch {
		case s != "" && isSpace(s[0]):
			s = s[1:]
		case s != "" && isSpace(s[len(s)-1]):
			s = s[:len(s)-1]
		case len(s) >= 2 && s[0] == '\\' && isEscapedSpace(s[1]):
			s = s[2:]
		case len(s) >= 2 && s[len(s)-2] == '\\' && isEscapedSpace(s[len(s)-1]):
			s = s[:len(s)-2]
		default:
			return strings.TrimSuffix(s, ".")
		}
	}
}

// isLowerASCII reports whether s holds only ASCII and no upper-case letter.
func isLowerASCII(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r >= 0x80 || 'A' <= r && r <= 'Z' }) < 0
}

// isEscapedSpace reports whether c after a backslash escapes JSON
// whitespace.
func isEscapedSpace(c byte) bool { return c == 'n' || c == 'r' || c == 't' }
