package classify

import "strings"

// This file is a raw JSON scanner, just enough to find top-level members of
// a JSON-RPC message. Every result is a sub-slice of its input: nothing is
// unescaped, copied or allocated. Keys are compared byte for byte, so an
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
