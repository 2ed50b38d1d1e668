package wire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/classify/sse"
)

// EventRewriter turns an upstream SSE stream into the agent's, so that a
// heal stays invisible (docs/streams.md "Streams and session state across a heal"):
//
//   - event ids become "<gen>-<upstream id>": a Last-Event-ID from the agent
//     then names the upstream session generation it belongs to, and is
//     forwarded only within that generation;
//   - from generation 2 on, ids of server→client requests become
//     "mcpheal-g<gen>-n<number>" or "…-s<string>", because a new upstream
//     session numbers its requests from the start again and the agent must
//     never see one id twice in its session (JSON-RPC ids are unique per
//     requester and session, MCP basic/index).
//
// Everything else passes through untouched. The first events of an answer
// are framed whole (fr, then event) so that the first can be judged; the
// rest is relayed line by line as it arrives (stream, in relay.go).
type EventRewriter struct {
	Fr  sse.Framer
	Gen uint64
	// meter counts a held line past freeHold, and its rewritten copy, in
	// the memory budget (relay.go); events a route reads itself too
	// (attempt.eachEvent).
	Meter holdMeter
	// lastID is the upstream id of the last event that ended (its blank
	// line passed), for resumption: the server replays what follows it, so
	// an event cut half-way comes again whole. nextID is the id field of
	// the event in progress, set: it had one.
	LastID  string
	nextID  string
	setID   bool
	inEvent bool   // a line of an event that has not ended has passed
	cut     []byte // what ends a line or event a resumption cut (resumed), written first
	RetryMs int    // the last retry: field, 0 if none
	// own, when not 0, gives every event that has an id or carries data
	// mcpheal's own id instead of the upstream's, "m<own>-<seq>"
	// (answerlog.go); not an event that only sets retry: (with empty data
	// or none), which an agent would take for a priming event if it had an
	// id. seq counts the events of the answer; idOut says the event in
	// progress has had its id.
	Own     uint64
	seq     uint64
	idOut   bool
	hasData bool // the event in progress carries data: a message, not a priming or retry: event
	IdBuf   []byte
	// watch: keep the data of the stream's response in response (a
	// tools/list answer, whose tools the proxy learns); it ends once
	// response is set.
	Watch    bool
	Response []byte

	// answered: a JSON-RPC response has passed (an answer stream that
	// ends without one leaves its request unanswered).
	Answered bool

	// The line relay (relay.go). max caps a line held whole (0: no cap).
	Max   int
	lines sse.Lines
	Mode  lineMode
	Held  []byte // the current line, while it must be seen whole
	// head is the start of the data line passing through, to tell a
	// response from a notification or a server→client request.
	head  [headLen]byte
	headN int
	data  bool // the line passing through is a data line
}

// Next returns the next complete event of the stream framed so far.
func (er *EventRewriter) Next() ([]byte, bool, error) { return er.Fr.Next() }

// Event appends one complete event to out, rewritten where needed.
func (er *EventRewriter) Event(out, ev []byte) []byte {
	if !er.Answered && IsResponse(sse.Data(nil, ev)) {
		er.Answered = true
	}
	if er.Gen <= 1 && er.Own == 0 && !er.Watch && !bytes.Contains(ev, []byte("id:")) && !bytes.Contains(ev, []byte("retry:")) {
		return append(out, ev...) // the common case: nothing to change
	}
	for len(ev) > 0 {
		line, rest := sse.NextLine(ev)
		ending := ev[len(line) : len(ev)-len(rest)]
		out = append(out, er.startLine(len(line) == 0 && len(ending) > 0)...)
		out = er.line(out, line)
		out = append(out, ending...) // the line ending as it came
		ev = rest
	}
	return out
}

// startLine notes that a line begins, blank or not, and returns what goes
// to the agent before it: mcpheal's own id, for an event about to end
// without one. An event is one or more lines ended by a blank line, as
// answerLog counts them (comments included, so that the two agree).
func (er *EventRewriter) startLine(blank bool) []byte {
	switch {
	case blank:
		var id []byte
		if er.Own != 0 && er.inEvent && !er.idOut && er.hasData {
			id = append(er.ownID(er.IdBuf[:0]), '\n')
			er.IdBuf = id
		}
		er.endEvent()
		return id
	case !er.inEvent:
		er.inEvent, er.idOut, er.hasData = true, false, false
		er.seq++
	}
	return nil
}

// ResumeOwn gives the events that follow mcpheal's ids of answer own,
// numbered after seq: an answer taken over from another replica
// (route/stream's ServeShared) goes on where its log ends.
func (er *EventRewriter) ResumeOwn(own uint64, seq int) { er.Own, er.seq = own, uint64(seq) }

// Seq is the number of the last event begun.
func (er *EventRewriter) Seq() int { return int(er.seq) }

// ownID appends the id field of the event in progress, mcpheal's own.
func (er *EventRewriter) ownID(out []byte) []byte {
	er.idOut = true
	out = sse.AppendFieldName(out, "id")
	return appendOwnID(out, er.Own, er.seq)
}

// endEvent records that an event ended: its id, if it had one, is where
// the stream resumes (HTML Living Standard §9.2.6: the last event ID is
// set when an event is dispatched, a priming event with no data
// included).
func (er *EventRewriter) endEvent() {
	if er.setID {
		er.LastID, er.setID = er.nextID, false
	}
	er.inEvent = false
}

// NoteEvent records the id and retry: of a whole event that a route reads
// itself (attempt.eachEvent) rather than relays: where its stream resumes,
// and after how long. An id equal to the last allocates nothing.
func (er *EventRewriter) NoteEvent(ev []byte) {
	if id, ok := sse.ID(ev); ok && string(id) != er.LastID {
		er.LastID = string(id)
	}
	if ms, ok := sse.Retry(ev); ok {
		er.RetryMs = ms
	}
}

// line appends one field line, rewritten.
func (er *EventRewriter) line(out, line []byte) []byte {
	name, v, comment := sse.Field(line)
	if comment {
		return append(out, line...)
	}
	switch string(name) {
	case "id":
		er.nextID, er.setID = string(v), true
		if er.Own != 0 {
			return er.ownID(out) // the upstream's id is kept for resuming upstream (resume.go)
		}
		if len(v) == 0 {
			return append(out, line...)
		}
		out = sse.AppendFieldName(out, "id")
		out = strconv.AppendUint(out, er.Gen, 10)
		out = append(out, '-')
		return append(out, v...)
	case "retry":
		if ms, err := strconv.Atoi(string(v)); err == nil {
			er.RetryMs = ms
		}
	case "data":
		er.hasData = er.hasData || notBlank(v)
		if er.Watch && IsResponse(v) {
			er.Response, er.Watch = append(er.Response[:0], v...), false
		}
		if er.Gen > 1 {
			if nv, ok := namespaceRequestID(v, er.Gen); ok {
				out = sse.AppendFieldName(out, "data")
				return append(out, nv...)
			}
		}
	}
	return append(out, line...)
}

// namespaceRequestID rewrites the id of a server→client JSON-RPC request.
func namespaceRequestID(msg []byte, gen uint64) ([]byte, bool) {
	s := B2s(msg)
	if !gjson.Get(s, "method").Exists() {
		return nil, false
	}
	id := gjson.Get(s, "id")
	if !id.Exists() || id.Index <= 0 || id.Type == gjson.Null {
		return nil, false // a notification
	}
	var tag string
	switch id.Type {
	case gjson.Number:
		tag = "n" + id.Raw
	case gjson.String:
		tag = "s" + id.Str
	default:
		return nil, false
	}
	nid, _ := json.Marshal("mcpheal-g" + strconv.FormatUint(gen, 10) + "-" + tag)
	out := make([]byte, 0, len(msg)+len(nid))
	out = append(out, msg[:id.Index]...)
	out = append(out, nid...)
	return append(out, msg[id.Index+len(id.Raw):]...), true
}

// AnswerRoute decides where an agent's answer to a server→client request
// goes: it returns the body to send upstream with the id restored (nil when
// the body goes as it is), or ok false when the request belonged to a dead
// generation (drop it: the upstream session that asked is gone).
func AnswerRoute(body []byte, id string, gen uint64) ([]byte, bool) {
	const prefix = `"mcpheal-g`
	if !strings.HasPrefix(id, prefix) {
		return nil, gen <= 1 // an id from generation 1 is sent as it was
	}
	v := gjson.Get(B2s(body), "id")
	rest := strings.TrimPrefix(v.Str, "mcpheal-g")
	g, tag, found := strings.Cut(rest, "-")
	if !found || len(tag) == 0 || g != strconv.FormatUint(gen, 10) {
		return nil, false
	}
	var raw []byte
	switch tag[0] {
	case 'n':
		raw = []byte(tag[1:])
	case 's':
		raw, _ = json.Marshal(tag[1:])
	default:
		return nil, false
	}
	out := make([]byte, 0, len(body))
	out = append(out, body[:v.Index]...)
	out = append(out, raw...)
	return append(out, body[v.Index+len(v.Raw):]...), true
}

// AnswerGen returns the generation named by the id of an agent's answer to
// a server→client request, 0 for an id mcpheal did not rewrite.
func AnswerGen(id string) uint64 {
	rest, ok := strings.CutPrefix(id, `"mcpheal-g`)
	if !ok {
		return 0
	}
	g, _, _ := strings.Cut(rest, "-")
	n, _ := strconv.ParseUint(g, 10, 64)
	return n
}

// UpstreamEventID returns the upstream part of an agent's Last-Event-ID when
// it belongs to generation gen, else "".
func UpstreamEventID(agentID []byte, gen uint64) string {
	g, rest, ok := strings.Cut(string(agentID), "-")
	if !ok || g != strconv.FormatUint(gen, 10) {
		return ""
	}
	return rest
}

// appendOwnID appends mcpheal's id of event seq of answer own.
func appendOwnID(out []byte, own, seq uint64) []byte {
	out = append(out, 'm')
	out = strconv.AppendUint(out, own, 36)
	out = append(out, '-')
	return strconv.AppendUint(out, seq, 10)
}

// ParseOwnID splits a Last-Event-ID of mcpheal's own into the answer's key
// ("m<own>") and the event's number; ok is false for any other id.
func ParseOwnID(id []byte) (key string, seq int, ok bool) {
	s := string(id)
	if !strings.HasPrefix(s, "m") {
		return "", 0, false
	}
	key, n, found := strings.Cut(s, "-")
	if !found {
		return "", 0, false
	}
	seq, err := strconv.Atoi(n)
	if err != nil || seq < 0 {
		return "", 0, false
	}
	return key, seq, true
}
