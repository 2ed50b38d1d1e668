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
		if p == "" || strings.IndexFunc(p, func(r rune) bool { return r >= 0x80 || 'A' <= r && r <= 'Z' }) >= 0 {
			panic("classify: foldSet phrases must be non-empty lower-case ASCII: " + p)
		}
		fs.first[p[0]] |= 1 << j
		if 'a' <= p[0] && p[0] <= 'z' {
			fs.first[p[0]-('a'-'A')] |= 1 << j
		}
	}
	return fs
}

// in reports whether s contains one of the phrases. With whole set, a match
// counts only as whole words: the bytes around it must not be letters,
// digits or '_', so "unexpired session" does not contain "expired session".
// s may be raw JSON string text, so a letter right after a backslash is an
// escape (\n, \t) and counts as a boundary.
func (fs *foldSet) in(s string, whole bool) bool {
	for i := 0; i < len(s); i++ {
		for m := fs.first[s[i]]; m != 0; m &= m - 1 {
			p := fs.phrases[bits.TrailingZeros8(m)]
			if !hasPrefixFold(s[i:], p) {
				continue
			}
			if !whole || isBoundary(s, i, i+len(p)) {
				return true
			}
		}
	}
	return false
}

// isBoundary reports whether s[i:end] is delimited as a whole word.
func isBoundary(s string, i, end int) bool {
	before := i == 0 || !isWordByte(s[i-1]) || (i >= 2 && s[i-2] == '\\')
	after := end == len(s) || !isWordByte(s[end])
	return before && after
}

func isWordByte(c byte) bool {
	c = lower(c)
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_'
}
