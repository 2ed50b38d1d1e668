package wire

import (
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Error codes of the JSON-RPC errors mcpheal writes itself. -32700 and
// -32600 are JSON-RPC 2.0 §5.1; -32001 is what the MCP TypeScript SDK sends
// for an unknown session, which every client recognises; the rest are
// mcpheal's own, in the implementation-defined server error range.
const (
	CodeParseError      = -32700
	CodeInvalidRequest  = -32600
	CodeSessionNotFound = -32001
	// codeUpstreamDown: the upstream stayed unreachable for the whole heal
	// budget; HTTP 503 with Retry-After. The session stays valid.
	CodeUpstreamDown = -32010
	// codeMaybeExecuted: the connection died after the request was sent and
	// the method is not safe to run twice, so it was not replayed.
	CodeMaybeExecuted = -32011
	// codeProxyError: mcpheal itself failed (a bug); HTTP 502.
	CodeProxyError = -32012
	// codeForbidden: Host or Origin refused (DNS-rebinding guard); HTTP 403.
	CodeForbidden = -32013
	// codeUnauthorized: inbound auth failed; HTTP 401.
	CodeUnauthorized = -32014
	// codeTooMany: a per-session or per-credential cap; HTTP 429.
	CodeTooMany = -32015
	// codeTooLarge: an upstream answer passed one of mcpheal's size caps;
	// the answer was cut and ends with this error.
	CodeTooLarge = -32016
	// codeBudget: buffering an upstream answer would pass the upstream's
	// memory_budget; HTTP 503 with Retry-After.
	CodeBudget = -32017
	// codeCredential: mcpheal could not get the upstream credential it
	// owns (the token endpoint refused or did not answer); nothing was
	// sent. HTTP 502 for a refusal, 503 with Retry-After otherwise.
	CodeCredential = -32018
	// codeJournalFull: the request would pass the session's max_journal
	// (the state mcpheal restores after a heal); it was not sent. HTTP 200.
	CodeJournalFull = -32019
	// codeUpstreamInvalid: the upstream's answer cannot be used as it is
	// (a session id longer than mcpheal carries); HTTP 502.
	CodeUpstreamInvalid = -32020
	// codeHeaderMismatch is MCP 2026-07-28's own -32020 (HeaderMismatch):
	// an HTTP header that disagrees with the body. It is the same number as
	// codeUpstreamInvalid, which mcpheal chose before 2026-07-28 took it;
	// the held route answers it only to 2026-07-28 agents.
	CodeHeaderMismatch = -32020
)

// Message is what the proxy needs to know of one agent POST body. Fields are
// views into the request body, valid until the handler returns.
type Message struct {
	Method string // "" for a JSON-RPC response or a batch
	ID     string // raw JSON id ("1", "\"a\"", ""); "" for a notification
	Tool   string // params.name of a tools/call
	Batch  bool
	Get    bool // the agent's standalone GET stream, not a POST
	Dup    bool // a member routed on appears twice: refused
}

// IdOrNull returns the id for an error answer.
func (m *Message) IdOrNull() string {
	if m.ID == "" {
		return "null"
	}
	return m.ID
}

// IsRequest reports whether the message expects a response.
func (m *Message) IsRequest() bool { return m.ID != "" && m.Method != "" }

// ParseMessage reads the fields of body the proxy routes on. body must be
// valid JSON. A member the proxy routes on that appears twice (method, id,
// params, or the name of a tools/call) makes the message ambiguous: mcpheal
// would judge one value and the server act on another (servers keep the
// last), so such a message is refused (m.dup).
func ParseMessage(body []byte) (m Message) {
	s := B2s(body)
	r := gjson.Parse(s)
	if r.IsArray() {
		m.Batch = true
		return m
	}
	var params gjson.Result
	seen := 0
	r.ForEach(func(k, v gjson.Result) bool {
		// Keys compare ignoring case: Go's encoding/json (mcp-go and many
		// Go servers) matches them so, and keeps the last.
		bit := 0
		switch {
		case strings.EqualFold(k.Str, "method"):
			bit, m.Method = 1, v.Str
		case strings.EqualFold(k.Str, "id"):
			bit, m.ID = 2, ""
			if v.Type != gjson.Null {
				m.ID = v.Raw
			}
		case strings.EqualFold(k.Str, "params"):
			bit, params = 4, v
		}
		m.Dup = m.Dup || seen&bit != 0
		seen |= bit
		return true
	})
	if m.Method == "tools/call" && params.IsObject() {
		names := 0
		params.ForEach(func(k, v gjson.Result) bool {
			if strings.EqualFold(k.Str, "name") {
				m.Tool = v.Str
				names++
			}
			return true
		})
		m.Dup = m.Dup || names > 1
	}
	return m
}

// ErrorCode returns error.code of a JSON-RPC answer, or 0.
func ErrorCode(body []byte) int64 {
	return gjson.GetBytes(body, "error.code").Int()
}

// WriteError answers the agent with a JSON-RPC error carrying id (raw JSON).
func WriteError(ctx *fasthttp.RequestCtx, status, code int, id, msg string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(AppendError(ctx.Response.Body()[:0], code, id, msg))
}

// AppendError appends a JSON-RPC error message carrying id (raw JSON) to b.
func AppendError(b []byte, code int, id, msg string) []byte {
	b = append(b, `{"jsonrpc":"2.0","error":{"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"message":`...)
	b = strconv.AppendQuote(b, msg)
	b = append(b, `},"id":`...)
	if id == "" {
		id = "null"
	}
	b = append(b, id...)
	return append(b, '}')
}

// B2s views b as a string without copying; b must not change while the
// string is in use.
func B2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
