package proxy

import "unicode/utf8"

// Log keys, one spelling everywhere: an operator's query for a key finds
// every line that has it.
const (
	logSession    = "session" // short hash of the client id
	logUpstreamID = "upstream_session"
	logGen        = "gen"
	logReason     = "reason"
	logDuration   = "duration"
	logMethod     = "method" // an agent's: logText
	logTool       = "tool"   // an agent's: logText
	logClass      = "class"
	logStatus     = "status"
	logAttempt    = "attempt"
	logUpstream   = "upstream"
	logListen     = "listen"
)

// logText is a value an agent sent (a method, a tool name) as a log line
// carries it: cut at maxSpanText bytes, as a span attribute is, so that
// an agent cannot write megabytes into every line mcpheal logs of it. It
// allocates only for a value that long.
func logText(s string) string {
	if len(s) <= maxSpanText {
		return s
	}
	cut := maxSpanText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
