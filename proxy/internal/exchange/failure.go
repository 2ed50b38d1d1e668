package exchange

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// Failure is mcpheal's own answer for an outcome that is not the
// upstream's: the HTTP status (for a JSON answer), the JSON-RPC error, and
// Retry-After (0: none). It is the one table of mcpheal's errors (docs/observability.md
// "Errors mcpheal answers itself"), for every route, JSON or SSE.
type Failure struct {
	Status, Code int
	Msg          string
	RetryAfter   int
	Challenge    string // WWW-Authenticate, for a 401
}

// WriteFailure writes mcpheal's error f as the JSON answer to m, with
// the status agentStatus gives it.
func WriteFailure(ctx *fasthttp.RequestCtx, m *wire.Message, f Failure) {
	status := agentStatus(m, f.Status)
	if status == fasthttp.StatusAccepted {
		ctx.Response.Reset()
		ctx.SetStatusCode(status)
		return
	}
	wire.WriteError(ctx, status, f.Code, m.IdOrNull(), f.Msg)
	if f.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	if f.Challenge != "" {
		ctx.Response.Header.Set("WWW-Authenticate", f.Challenge)
	}
}

// agentStatus is the HTTP status that mcpheal's own answer of the given
// status goes to the agent with (docs/observability.md "Errors mcpheal
// answers itself"). An operational failure (the upstream down, the breaker
// open, a cap or the memory budget reached, an answer mcpheal could not
// carry: a 5xx or a 429) to a JSON-RPC request goes as HTTP 200 with its
// JSON-RPC error and Retry-After, because that is the one answer every
// real client surfaces to its caller at once: the MCP Python SDK 1.x
// (Hermes' client) raises on any other status inside its transport task,
// where the pending call is never answered and waits for its own timeout.
// The same failure for a notification or a response is 202: it is
// dropped, as MCP's rule for a notification to a dead session has it,
// because that SDK tears its whole transport down on anything else. A GET
// stream, a refusal of the agent's own input (400, 413, …), a credential
// challenge (401, 403) and a session the agent must start again (404)
// keep their status.
func agentStatus(m *wire.Message, status int) int {
	if status < 500 && status != fasthttp.StatusTooManyRequests || m.Get {
		return status
	}
	if m.IsRequest() || m.Batch {
		return fasthttp.StatusOK
	}
	return fasthttp.StatusAccepted
}
