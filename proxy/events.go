package proxy

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// eventRewriter turns an upstream SSE stream into the agent's, one complete
// event at a time, so that a heal stays invisible (DESIGN "Streams"):
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
// Events that need neither pass through untouched.
type eventRewriter struct {
	gen     uint64
	pending []byte // a partial event waiting for the rest
	lastID  string // the last upstream event id seen, for resumption
	retryMs int    // the last retry: field, 0 if none
}

// feed appends p to the stream and appends to out every event completed by
// it, rewritten. A trailing partial event stays pending.
func (er *eventRewriter) feed(out, p []byte) []byte {
	data := p
	if len(er.pending) > 0 {
		er.pending = append(er.pending, p...)
		data = er.pending
	}
	off := 0
	for {
		n := eventLen(data[off:])
		if n < 0 {
			break
		}
		out = er.event(out, data[off:off+n])
		off += n
	}
	rest := data[off:]
	if len(er.pending) > 0 {
		er.pending = append(er.pending[:0], rest...)
	} else if len(rest) > 0 {
		er.pending = append(er.pending, rest...)
	}
	return out
}

// event appends one complete event to out, rewritten where needed.
func (er *eventRewriter) event(out, ev []byte) []byte {
	if er.gen <= 1 && !bytes.Contains(ev, []byte("id:")) && !bytes.Contains(ev, []byte("retry:")) {
		return append(out, ev...) // the common case: nothing to change
	}
	for len(ev) > 0 {
		end := lineEnd(ev)
		line, term := ev[:end], ev[end:]
		next := len(ev)
		if i := bytes.IndexAny(term, "\r\n"); i == 0 {
			next = end + 1
			if term[0] == '\r' && len(term) > 1 && term[1] == '\n' {
				next++
			}
		}
		out = er.line(out, line)
		out = append(out, ev[end:next]...)
		ev = ev[next:]
	}
	return out
}

func lineEnd(b []byte) int {
	if i := bytes.IndexAny(b, "\r\n"); i >= 0 {
		return i
	}
	return len(b)
}

// line appends one field line, rewritten.
func (er *eventRewriter) line(out, line []byte) []byte {
	switch {
	case bytes.HasPrefix(line, []byte("id:")):
		v := strings.TrimPrefix(string(line[3:]), " ")
		er.lastID = v
		if v == "" {
			return append(out, line...)
		}
		out = append(out, "id: "...)
		out = strconv.AppendUint(out, er.gen, 10)
		out = append(out, '-')
		return append(out, v...)
	case bytes.HasPrefix(line, []byte("retry:")):
		if ms, err := strconv.Atoi(strings.TrimSpace(string(line[6:]))); err == nil {
			er.retryMs = ms
		}
	case er.gen > 1 && bytes.HasPrefix(line, []byte("data:")):
		v := bytes.TrimPrefix(line[5:], []byte(" "))
		if nv, ok := namespaceRequestID(v, er.gen); ok {
			out = append(out, "data: "...)
			return append(out, nv...)
		}
	}
	return append(out, line...)
}

// namespaceRequestID rewrites the id of a server→client JSON-RPC request.
func namespaceRequestID(msg []byte, gen uint64) ([]byte, bool) {
	s := b2s(msg)
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

// answerRoute decides where an agent's answer to a server→client request
// goes: it returns the body to send upstream with the id restored (nil when
// the body goes as it is), or ok false when the request belonged to a dead
// generation (drop it: the upstream session that asked is gone).
func answerRoute(body []byte, id string, gen uint64) ([]byte, bool) {
	const prefix = `"mcpheal-g`
	if !strings.HasPrefix(id, prefix) {
		return nil, gen <= 1 // an id from generation 1 is sent as it was
	}
	v := gjson.Get(b2s(body), "id")
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

// upstreamEventID returns the upstream part of an agent's Last-Event-ID when
// it belongs to generation gen, else "".
func upstreamEventID(agentID []byte, gen uint64) string {
	g, rest, ok := strings.Cut(string(agentID), "-")
	if !ok || g != strconv.FormatUint(gen, 10) {
		return ""
	}
	return rest
}
