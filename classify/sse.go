package classify

import "github.com/mcpheal/mcpheal/classify/sse"

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
// ("id: x\ndata: \n\n" or "data:\n"). Lines and fields are split by
// [sse.NextLine] and [sse.Field], the one home of those rules.
//
// Every MCP server writes one JSON-RPC message per event on one data line, so
// the first such line is the message; a message split over several data
// lines is classified from its first line only. A last line without its
// terminator still counts: s may be a prefix of the stream. A byte order
// mark and whitespace before the first field are skipped as a whole-body
// prefix, so that neither changes the result.
func firstData(s string) string {
	rest := s2b(trimLeft(s))
	for len(rest) > 0 {
		var line []byte
		line, rest = sse.NextLine(rest)
		name, v, comment := sse.Field(line)
		if !comment && string(name) == "data" && trimLeft(b2s(v)) != "" {
			return b2s(v)
		}
	}
	return ""
}
