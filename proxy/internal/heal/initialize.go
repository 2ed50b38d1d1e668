package heal

import (
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/session"
)

// recipeHeaders copies the headers of the upstream initialize request that
// identify the agent (credentials, custom headers), leaving out what each
// request sets itself.
func recipeHeaders(h *fasthttp.RequestHeader) [][2]string {
	var out [][2]string
	for k, v := range h.All() {
		switch string(k) {
		case "Host", "Content-Length", "Content-Type", "Accept", "Mcp-Session-Id", "Mcp-Protocol-Version",
			"Last-Event-Id", "User-Agent", "Mcp-Method", "Mcp-Name", "Traceparent", "Tracestate":
			// The last four belong to one request: each request of the
			// session sets its own.
			continue
		}
		out = append(out, [2]string{string(k), string(v)})
	}
	return out
}

// LearnTools records which tools the upstream declares safe to run twice
// (readOnlyHint or idempotentHint, MCP 2025-03-26+ tool annotations) from a
// tools/list answer, passing through or mcpheal's own: msg is its JSON-RPC
// message. It reports whether the list differs from the one the session
// saw before. The list is the result's tools array, as the server wrote it:
// what a route adds around it for its agent (the held route's resultType,
// ttlMs, cacheScope) is not the list.
func LearnTools(sess *session.Session, msg []byte) (changed bool) {
	d := msg
	if res := gjson.GetBytes(d, "result"); res.IsObject() && !gjson.Get(res.Raw, "nextCursor").Exists() {
		changed = sess.SeeTools([]byte(gjson.Get(res.Raw, "tools").Raw)) // the first page of a paged list is not the list
	}
	gjson.GetBytes(d, "result.tools").ForEach(func(_, t gjson.Result) bool {
		name := t.Get("name").String()
		if name != "" {
			ann := t.Get("annotations")
			sess.SetReplayable(name, ann.Get("readOnlyHint").Bool() || ann.Get("idempotentHint").Bool())
			var hs map[string]string
			t.Get("inputSchema.properties").ForEach(func(p, v gjson.Result) bool {
				if h := v.Get("x-mcp-header"); h.Type == gjson.String && h.Str != "" && len(h.Str) <= 64 {
					if hs == nil {
						hs = map[string]string{}
					}
					hs[p.Str] = h.Str
				}
				return true
			})
			sess.SetParamHeaders(name, hs)
		}
		return true
	})
	return changed
}
