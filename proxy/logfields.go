package proxy

// Log keys, one spelling everywhere: an operator's query for a key finds
// every line that has it.
const (
	logSession    = "session" // short hash of the client id
	logUpstreamID = "upstream_session"
	logGen        = "gen"
	logReason     = "reason"
	logDuration   = "duration"
	logMethod     = "method"
	logClass      = "class"
	logStatus     = "status"
	logAttempt    = "attempt"
	logUpstream   = "upstream"
	logListen     = "listen"
)
