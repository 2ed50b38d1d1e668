// Package upstream speaks HTTP/1.1 to one MCP server.
//
// It owns a small pool of keep-alive connections and exposes one operation in
// two kinds, which write a request and read the response head by a deadline:
// Client.Do for a replay-safe request, which it may send once more on a fresh
// connection when a stale pooled one breaks, and Client.DoOnce for a request
// that must not run twice, which it sends at most once and never on a pooled
// connection whose peer is in doubt. A JSON answer is read whole; a
// text/event-stream answer is handed back as a stream that the caller reads
// event by event.
//
// Why not fasthttp.HostClient: replay safety needs to know, per request,
// whether any request byte reached the socket and whether the connection was a
// reused one (an idle pooled socket that a NAT or load balancer may have
// dropped). HostClient hides both, and it keeps the first-byte read deadline on
// the connection while a streamed body is read, which would cut a long tool's
// SSE answer. The pool here is small and uses fasthttp's own request writer and
// response parser.
//
// What this package must not do: decide what an answer means (that is
// classify), send a request that may have been delivered again unless the
// caller chose Do for it (the replay decision is the caller's, made with
// Delivered and NotSent), or log.
//
// Invariants:
//   - every call has a deadline for the response head; a streamed body has none
//     (a tool may run for as long as it sends events);
//   - a connection goes back to the pool only after its response was read to
//     the end and neither side asked to close it;
//   - an idle connection older than Config.MaxIdleConn is never reused, and
//     one older than Config.StaleAfter never carries a DoOnce request;
//   - a failure's Written counts every try: evidence of delivery is never lost.
package upstream
