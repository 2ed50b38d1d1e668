package exchange

import (
	"io"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// Writer is the one writer of what a route answers its agent: the held
// route, the bridge and the GET streams hand their answers here, as the
// session pass-through's attempt does through Attempt.Answer, and the
// writer writes each and counts its request once (obs.Counters.Requests)
// by the class of what the upstream did. classify.Unknown counts nothing:
// the upstream was not asked (the agent's own input refused, a
// notification taken).
type Writer struct {
	count *obs.Counters
	mem   *wire.Budget
}

// Writer returns the writer of the answers of e's routes.
func (e *Env) Writer() Writer { return Writer{count: e.Count, mem: e.Mem} }

// Count counts m as an exchange that ended in cls, for an answer that a
// stream already under way carries (an event of the agent's stream), or a
// notification taken.
func (w Writer) Count(m *wire.Message, cls classify.Class) {
	if cls != classify.Unknown {
		w.count.Request(m, cls)
	}
}

// Status answers with status alone: 202 to a notification or a response
// taken, or a refusal of one (a notification has no id to answer).
func (w Writer) Status(ctx *fasthttp.RequestCtx, m *wire.Message, status int, cls classify.Class) {
	w.Count(m, cls)
	ctx.SetStatusCode(status)
}

// Refuse answers the agent's own input with mcpheal's JSON-RPC error
// (code, msg) under status, with m's id: the upstream was not asked.
func (w Writer) Refuse(ctx *fasthttp.RequestCtx, m *wire.Message, status, code int, msg string) {
	wire.WriteError(ctx, status, code, m.IdOrNull(), msg)
}

// RefuseBody answers the agent's own input with a refusal mcpheal built
// whole (a -32022 naming the versions it speaks).
func (w Writer) RefuseBody(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(wire.MimeJSON)
	ctx.SetBody(body)
}

// Fail answers m with mcpheal's own failure f (WriteFailure: the status
// every client surfaces at once, Retry-After, a challenge), counted as cls.
func (w Writer) Fail(ctx *fasthttp.RequestCtx, m *wire.Message, cls classify.Class, f Failure) {
	w.Count(m, cls)
	WriteFailure(ctx, m, f)
}

// JSON answers m with a JSON answer a route built (the upstream's, put in
// the agent's era, or its own), under status and, when sess is not nil,
// its session id, held in the memory budget until written (-32017 when it
// has no room). An empty body answers with the status alone. It counts m
// as cls, and the answer's bytes when written; it reports false when the
// budget had no room.
func (w Writer) JSON(ctx *fasthttp.RequestCtx, m *wire.Message, cls classify.Class, status int, body []byte, sess *session.Session) bool {
	w.Count(m, cls)
	if len(body) == 0 {
		ctx.SetStatusCode(status)
		return true
	}
	if !writeJSONAnswer(ctx, status, body, sess, w.mem) {
		return false
	}
	w.count.BytesOut.Add(uint64(len(body)))
	return true
}

// Held answers m with body, a JSON answer built in room the memory budget
// gave it first (an initialize answer that carries the server's
// instructions), under 200 and sess's id; it counts m as cls and the
// answer's bytes.
func (w Writer) Held(ctx *fasthttp.RequestCtx, m *wire.Message, cls classify.Class, body *BudgetBody, sess *session.Session) {
	w.Count(m, cls)
	writeBudgetBody(ctx, fasthttp.StatusOK, body, sess)
	w.count.BytesOut.Add(uint64(len(body.B)))
}

// ClassOf is the class of a JSON answer a route built from the upstream's.
func ClassOf(status int, msg []byte) classify.Class {
	return classify.Classify(status, wire.MimeJSON, msg)
}

// Stream answers m with an event stream that write writes, with sess's
// id when sess is not nil, and counts m as cls: OK for a stream that is
// the answer (a listen), Unknown for one whose answer is counted when it
// comes (Final).
func (w Writer) Stream(ctx *fasthttp.RequestCtx, m *wire.Message, sess *session.Session, cls classify.Class, write fasthttp.StreamWriter) {
	w.Count(m, cls)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentTypeBytes(wire.MimeEventStream)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	if sess != nil {
		ctx.Response.Header.SetBytesK(wire.HdrSessionID, string(sess.ID))
	}
	ctx.SetBodyStreamWriter(write)
}

// Relay answers with the event stream that write relays from the
// upstream (an agent's GET stream), under the head the exchange took from
// the upstream's answer and counted (Attempt.Run).
func (w Writer) Relay(ctx *fasthttp.RequestCtx, write fasthttp.StreamWriter) {
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.SetBodyStreamWriter(write)
}

// EndResumption answers a GET whose Last-Event-ID names a stream nothing
// holds any more (of a dead upstream session, or an answer whose log is
// gone), counted OK. That stream cannot be resumed, and a new standalone
// stream in its place would evict the agent's own (or be refused 409, and
// the go-sdk client then ends its session). An event stream that ends at
// once tells the agent's SDK the stream is over: a call it was resuming
// fails alone ("request terminated without response"), a standalone
// stream is reopened without Last-Event-ID.
func (w Writer) EndResumption(ctx *fasthttp.RequestCtx, m *wire.Message) {
	w.Count(m, classify.OK)
	ctx.Response.Header.SetContentTypeBytes(wire.MimeEventStream)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// Final counts m by its answer msg, the last event of its stream (Stream
// with Unknown), and returns the answer's class.
func (w Writer) Final(m *wire.Message, msg []byte) classify.Class {
	cls := ClassOf(fasthttp.StatusOK, msg)
	w.Count(m, cls)
	return cls
}

// writeJSONAnswer writes a JSON answer mcpheal built itself (a bridged answer),
// with the session's id, counted in the memory budget until written. It
// reports false when the budget had no room (the agent got -32017).
func writeJSONAnswer(ctx *fasthttp.RequestCtx, status int, body []byte, sess *session.Session, mem *wire.Budget) bool {
	if !mem.Take(int64(len(body))) {
		// body answers a request: its id is the request's.
		req := wire.Message{ID: gjson.GetBytes(body, "id").Raw, Method: "request"}
		WriteFailure(ctx, &req, Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeBudget,
			Msg: "answer not relayed: mcpheal's memory_budget is reached; retry later", RetryAfter: 1})
		return false
	}
	writeBudgetBody(ctx, status, &BudgetBody{B: body, Mem: mem, N: int64(len(body))}, sess)
	return true
}

// writeBudgetBody writes body, held in the memory budget already, as the
// JSON answer under status, with sess's id when sess is not nil.
func writeBudgetBody(ctx *fasthttp.RequestCtx, status int, body *BudgetBody, sess *session.Session) {
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(wire.MimeJSON)
	if sess != nil {
		ctx.Response.Header.SetBytesK(wire.HdrSessionID, string(sess.ID))
	}
	ctx.Response.SetBodyStream(body, len(body.B))
}

// BudgetBody is an answer mcpheal built itself, counted in the memory
// budget (n bytes) until fasthttp has written it or the agent has gone:
// fasthttp calls Close once, either way.
type BudgetBody struct {
	B   []byte
	pos int
	Mem *wire.Budget
	N   int64
}

// Read copies the rest of the body to p (fasthttp uses WriteTo).
func (bb *BudgetBody) Read(p []byte) (int, error) {
	if bb.pos == len(bb.B) {
		return 0, io.EOF
	}
	n := copy(p, bb.B[bb.pos:])
	bb.pos += n
	return n, nil
}

// WriteTo writes the body in one Write.
func (bb *BudgetBody) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(bb.B[bb.pos:])
	bb.pos += n
	return int64(n), err
}

// Close gives the body's memory back to the budget.
func (bb *BudgetBody) Close() error {
	bb.Mem.Give(bb.N)
	bb.N, bb.B = 0, nil
	return nil
}
