package obs

import "unicode/utf8"

// Log keys, one spelling everywhere: an operator's query for a key finds
// every line that has it.
const (
	LogSession    = "session" // short hash of the client id
	LogUpstreamID = "upstream_session"
	LogGen        = "gen"
	LogReason     = "reason"
	LogDuration   = "duration"
	LogMethod     = "method" // an agent's: logText
	LogTool       = "tool"   // an agent's: logText
	LogClass      = "class"
	logStatus     = "status"
	logAttempt    = "attempt"
	LogUpstream   = "upstream"
	logListen     = "listen"
)

// LogText is a value an agent sent (a method, a tool name) as a log line
// carries it: cut at maxSpanText bytes, as a span attribute is, so that
// an agent cannot write megabytes into every line mcpheal logs of it. It
// allocates only for a value that long.
func LogText(s string) string {
	if len(s) <= MaxSpanText {
		return s
	}
	cut := MaxSpanText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
