package proxy

// Log keys, one spelling everywhere (STYLE §2).
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
