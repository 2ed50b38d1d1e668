package classify

import "strings"

// isEventStream reports whether the Content-Type value ct is
// text/event-stream. Type and subtype are case-insensitive and may be
// followed by parameters (RFC 9110 §8.3.1).
func isEventStream(ct string) bool {
	const mt = "text/event-stream"
	for ct != "" && (ct[0] == ' ' || ct[0] == '\t') {
		ct = ct[1:]
	}
	if !hasPrefixFold(ct, mt) {
		return false
	}
	rest := ct[len(mt):]
	return rest == "" || rest[0] == ';' || rest[0] == ' ' || rest[0] == '\t'
}

// firstData returns the value of the first data field in the SSE stream s
// that holds more than whitespace, or "" if there is none. That skips what
// comes before a JSON-RPC message: comments (": keepalive", TS SDK 1.30),
// id:, event: and retry: fields, and the 2025-11-25 priming event
// ("id: x\ndata: \n\n" or "data:\n"). Lines end in "\n", "\r\n" or "\r"; one
// space after "data:" is dropped (HTML Living Standard §9.2.6).
//
// Every MCP server writes one JSON-RPC message per event on one data line, so
// the first such line is the message; a message split over several data
// lines is classified from its first line only. A last line without its
// terminator still counts: s may be a prefix of the stream. A byte order
// mark and whitespace before the first field are skipped as a whole-body
// prefix, so that neither changes the result.
func firstData(s string) string {
	s = trimLeft(s)
	for s != "" {
		var line string
		line, s = cutLine(s)
		if v, ok := dataValue(line); ok && trimLeft(v) != "" {
			return v
		}
	}
	return ""
}

// cutLine splits s after its first line ending ("\n", "\r\n" or "\r").
func cutLine(s string) (line, rest string) {
	n := strings.IndexByte(s, '\n')
	if n < 0 {
		n = len(s)
	}
	if r := strings.IndexByte(s[:n], '\r'); r >= 0 {
		if r+1 < len(s) && s[r+1] == '\n' {
			return s[:r], s[r+2:]
		}
		return s[:r], s[r+1:]
	}
	if n == len(s) {
		return s, ""
	}
	return s[:n], s[n+1:]
}

// dataValue returns the value of line if it is a data field. Field names are
// case-sensitive; "data" with no colon is a data field with an empty value.
func dataValue(line string) (string, bool) {
	v, ok := strings.CutPrefix(line, "data")
	if !ok {
		return "", false
	}
	if v == "" {
		return "", true
	}
	if v[0] != ':' {
		return "", false // another field, such as "database:"
	}
	return strings.TrimPrefix(v[1:], " "), true
}
