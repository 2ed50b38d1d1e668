// Package classify decides what one upstream answer means for the proxy: pass
// it through (OK, ToolError, Auth, Protocol), heal the upstream session and
// replay (SessionGone), treat the upstream as unreachable (TransportDead),
// or as at capacity (Busy: wait its Retry-After or pass its answer on).
//
// Its API is [Classify], a pure function of the HTTP status, the
// Content-Type header and the first bytes of the body, the [Class] it
// returns, and [Refused], which tells the proxy's replay decision whether a
// 5xx answer proves that the server turned the request away before
// dispatching it (a generic 502/503/504 from a gateway proves nothing). The
// signals come from real servers (TypeScript, Python and Go SDKs, mcp-go,
// supergateway, WordPress, keryx; docs/healing.md "What it does with each answer"); each
// dialect is a golden file under testdata/<Class>/ or testdata/refused/.
//
// What it must not do: I/O, logging, keeping state, allocating, retaining or
// modifying its inputs, or deciding on a JSON-RPC error code alone (-32001
// means "Session not found" to the TypeScript SDK and "Request timed out" to
// its client; -32600 means session loss to Python and a malformed request to
// everyone else). It imports only the standard library and classify/sse,
// whose line and field rules it uses to peek at the first SSE event.
//
// Invariants, each asserted by a test:
//
//   - Pure and deterministic: the same input always gives the same answer.
//   - Zero allocations for every input (alloc_test.go, and FuzzClassify when
//     built without -race). Every value it inspects is a sub-slice of the
//     input; nothing is unescaped or copied. This is why JSON is read with a
//     small raw scanner (scan.go) and not with gjson: gjson.Get unescapes any
//     string it returns, so a message such as the Go SDK's
//     `method \"tools/call\" is invalid during session initialization`
//     costs two allocations even if only Result.Raw is read.
//   - In a 2xx answer, only the JSON-RPC error member can say the session
//     is gone, and only when its message (or the error itself when it is a
//     bare string) is, as a whole, one of the known server messages
//     (sessionMessages), ignoring ASCII case, surrounding whitespace and one
//     trailing period. A tool's own error that mentions a session ("charged
//     $20 but payment gateway session expired"), a successful result or an
//     isError tool result that says "session expired" is not a session
//     signal: the server dispatched the request, so replaying it could run
//     the tool twice.
//   - A UTF-8 byte order mark or leading whitespace before the body never
//     changes the answer, and a 2xx JSON body classifies the same whether it
//     arrives bare or as the data of one text/event-stream event.
//
// Classify expects answers to requests that carried an Mcp-Session-Id (the
// proxy always sends one after initialize): a 404 then means the session is
// gone (2025-11-25 basic/transports, "Session Management").
package classify
