package classify

import (
	"math/bits"
	"strings"
	"unsafe"
)

// This file holds the classifier's scanning: a raw JSON scanner, just
// enough to find top-level members of a JSON-RPC message, and ASCII
// case-folding for the words servers use. Every result of the JSON scanner
// is a sub-slice of its input: nothing is unescaped, copied or allocated. Keys are compared byte for byte, so an
// escaped key ("\u0065rror") never matches; no MCP implementation escapes
// plain ASCII keys. Malformed or truncated input yields "not found" or a
// value that runs to the end of the input, never a panic: the proxy may hand
// over only a prefix of the body.

// member returns the raw value of the member key of the JSON object that
// starts at obj[0] == '{', without surrounding whitespace. Only the object's
// own members are looked at: the scan stops at its closing brace.
func member(obj, key string) (string, bool) {
	i := 1
	for {
		k, v, ok := nextMember(obj, i)
		if !ok {
			return "", false
		}
		end := valueEnd(obj, v)
		if k == key {
			return obj[v:end], true
		}
		if i, ok = nextComma(obj, end); !ok {
			return "", false
		}
	}
}

// nextMember reads the member that starts at obj[i] (just after '{' or ',')
// and returns its raw key and the index of its value. ok is false at the
// closing brace, at the end of a truncated object, and on garbage.
func nextMember(obj string, i int) (key string, v int, ok bool) {
	i = skipSpace(obj, i)
	if i >= len(obj) || obj[i] != '"' {
		return "", 0, false
	}
	k, e := i, stringEnd(obj, i)
	i = skipSpace(obj, e)
	if i >= len(obj) || obj[i] != ':' {
		return "", 0, false
	}
	return obj[k+1 : e-1], skipSpace(obj, i+1), true // terminated: a ':' follows
}

// nextComma returns the index after the ',' that follows a value ending at
// end, or false if the object or array ends there.
func nextComma(s string, end int) (int, bool) {
	i := skipSpace(s, end)
	if i >= len(s) || s[i] != ',' {
		return 0, false
	}
	return i + 1, true
}

// mayHaveIsErrorTrue reports whether s may contain the member "isError":
// true. It is a filter for member: false is exact, true means "look
// closer". It searches for `Error"`, whose capital E is rare in JSON, so
// strings.Index runs a vectorised byte scan instead of stopping at every
// quote; an escaped key inside a string (\"isError\") never matches.
func mayHaveIsErrorTrue(s string) bool {
	const anchor = `Error"`
	for {
		i := strings.Index(s, anchor)
		if i < 0 {
			return false
		}
		key := i >= 3 && s[i-3:i] == `"is`
		s = s[i+len(anchor):]
		if !key {
			continue
		}
		j := skipSpace(s, 0)
		if j >= len(s) {
			return true // truncated: let member decide
		}
		if s[j] != ':' {
			continue
		}
		if j = skipSpace(s, j+1); j >= len(s) || s[j] == 't' {
			return true
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace (RFC 8259 §2), or len(s).
func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

// stringEnd returns the index just past the closing quote of the JSON string
// whose opening quote is s[i], or len(s) if it is not terminated. Short
// strings (keys, codes) are scanned byte by byte; past 32 bytes it jumps from
// quote to quote with a vectorised search, so a long tool result costs little.
func stringEnd(s string, i int) int {
	open := i
	for i++; i < len(s) && i-open <= 32; i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	for i < len(s) {
		j := strings.IndexByte(s[i:], '"')
		if j < 0 {
			break
		}
		i += j
		// The quote is escaped if an odd number of backslashes precedes it.
		n := 0
		for k := i - 1; k > open && s[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return i + 1
		}
		i++
	}
	return len(s)
}

// valueEnd returns the index just past the JSON value that starts at s[i],
// or len(s) if it is truncated.
func valueEnd(s string, i int) int {
	if i >= len(s) {
		return len(s)
	}
	switch s[i] {
	case '"':
		return stringEnd(s, i)
	case '{', '[':
		return containerEnd(s, i)
	}
	for ; i < len(s); i++ { // number, true, false, null or garbage
		switch s[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return len(s)
}

// containerEnd returns the index just past the object or array that starts
// at s[i], or len(s) if it is truncated. It counts depth instead of
// recursing, so deep nesting cannot exhaust the stack. Brackets are not
// matched by kind: this finds where a value ends, it does not validate it.
func containerEnd(s string, i int) int {
	depth := 0
	for i < len(s) {
		switch s[i] {
		case '"':
			i = stringEnd(s, i)
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return len(s)
}

// intCode parses a raw JSON-RPC error code. It accepts an integer with an
// optional fraction of zeros, because PHP servers (WordPress mcp-adapter
// stores codes as float) may send -32601.0. Codes have at most 9 digits here,
// which keeps the arithmetic far from overflow.
func intCode(raw string) (int, bool) {
	neg := strings.HasPrefix(raw, "-")
	if neg {
		raw = raw[1:]
	}
	n, digits := 0, 0
	for digits < len(raw) && '0' <= raw[digits] && raw[digits] <= '9' {
		if digits == 9 {
			return 0, false
		}
		n = n*10 + int(raw[digits]-'0')
		digits++
	}
	if digits == 0 {
		return 0, false
	}
	if rest := raw[digits:]; rest != "" {
		if rest[0] != '.' || len(rest) == 1 || strings.Trim(rest[1:], "0") != "" {
			return 0, false
		}
	}
	if neg {
		n = -n
	}
	return n, true
}

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
