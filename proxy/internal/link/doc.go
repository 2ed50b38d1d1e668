// Package link is mcpheal's side of one upstream (Link): every request
// sent upstream, the agent's and mcpheal's own, leaves through Link.Do or
// Link.DoOnce (a request that must not run twice: never resent, never on a
// connection whose liveness is in doubt); every request mcpheal makes on
// an agent's behalf is built by Link.Build and, read whole, sent by
// Link.Call. It owns the credential mcpheal holds for the upstream, the
// circuit breaker, the watch of an outage (Sleep, Success, Failure,
// OutageEnd), the one retry policy of every loop that tries the upstream
// again (Retry: breaker, backoff at a named pace, budget, a busy
// upstream waited out once) and the DELETEs of upstream sessions nobody
// uses.
//
// It must not heal, route or answer an agent: it reports what happened on
// the wire (upstream.Delivered travels with its errors) and leaves the
// decision to the exchange above it.
package link
