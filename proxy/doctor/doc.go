// Package doctor is `mcpheal doctor URL`: it probes an MCP server
// (Streamable HTTP) the way the proxy will talk to it, and reports what the
// proxy needs to know. See docs/observability.md, "Does mcpheal fit my server?".
//
// [Run] sends, in order: initialize with each session-era protocol version,
// server/discover with 2026-07-28 (SEP-2575), the handshake the proxy
// records (initialize, notifications/initialized), ping, tools/list (every
// page), a GET for the standalone stream, ping with a session id the server
// never issued but shaped like its own ([IDShape]), and DELETE of every
// session it opened. The answer to the unknown id is classified with
// [classify.Classify], exactly as the proxy classifies it, and decides the
// [Verdict].
//
// [RunWith] sends the same probes with mcpheal's own credential for the
// server ([Credential]: the token file of `mcpheal login`, a configured
// OAuth client or header, made by the caller as mcpheal makes it), as
// mcpheal's requests carry it: a 401 to it drops the token and the probe
// goes once more with a new one. A server that wants a login the doctor
// has no usable credential for is [VerdictNeedsLogin], with the command
// that logs mcpheal in, not a verdict on its sessions.
//
// What it must not do:
//
//   - import package proxy (or session, upstream): it is a one-shot CLI over
//     net/http, and a client independent of the proxy's keeps the report
//     honest about what the server itself says. A test over `go list -deps`
//     keeps it so.
//   - frame SSE itself: every answer is read by readAnswer with
//     [sse.Framer], and an answer's JSON-RPC response is the data of the
//     first complete event (ended by its blank line) that is a response.
//     A copy of the framing here once counted 8 of 13 tools from an answer
//     cut at 4 KiB.
//   - leave sessions behind: each one it opens is DELETEd before Run returns.
//
// Invariants: every request has its own deadline (probeTimeout, getTimeout);
// no answer is read past readLimit; a Go error from Run means the server was
// not reached at all, and everything else the server said is in the
// [Report].
package doctor
