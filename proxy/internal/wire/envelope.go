package wire

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/session"
)

// Envelope returns body as a 2026-07-28 request: id replaced by id, the
// params' _meta completed with the session's protocol version, client info,
// client capabilities and log level, and inputResponses and requestState
// set when not empty.
func Envelope(body []byte, id string, sess *session.Session, inputs []byte, state string) []byte {
	r := gjson.ParseBytes(body)
	init := gjson.Parse(sess.Recipe.InitBody)
	out := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
	out = append(out, `,"method":`...)
	out = append(out, r.Get("method").Raw...)
	out = append(out, `,"params":{`...)
	out, n, meta := CopyParams(out, r.Get("params"), false)
	comma := func() {
		if n > 0 {
			out = append(out, ',')
		}
		n++
	}
	if len(inputs) > 0 {
		comma()
		out = append(out, `"inputResponses":`...)
		out = append(out, inputs...)
	}
	if state != "" {
		comma()
		out = append(out, `"requestState":`...)
		out = append(out, state...)
	}
	comma()
	out = append(out, `"_meta":{"io.modelcontextprotocol/protocolVersion":"`+StatelessVersion+`"`...)
	if ci := init.Get("params.clientInfo"); ci.IsObject() {
		out = append(out, `,"io.modelcontextprotocol/clientInfo":`...)
		out = append(out, ci.Raw...)
	}
	out = append(out, `,"io.modelcontextprotocol/clientCapabilities":`...)
	if cc := init.Get("params.capabilities"); cc.IsObject() {
		out = append(out, cc.Raw...)
	} else {
		out = append(out, "{}"...)
	}
	if lvl := gjson.Get(sess.Journal().Level, "level"); lvl.Type == gjson.String {
		out = append(out, `,"io.modelcontextprotocol/logLevel":`...)
		out = append(out, lvl.Raw...)
	}
	out = AppendForeignMeta(out, meta)
	return append(out, "}}}"...)
}

// CopyParams appends to out the members of the params object, comma
// separated, but for those each era carries its own way: _meta, and unless
// inputs, inputResponses and requestState. It returns out, how many
// members it appended, and the _meta.
func CopyParams(out []byte, params gjson.Result, inputs bool) ([]byte, int, gjson.Result) {
	n := 0
	var meta gjson.Result
	params.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "_meta":
			meta = v
			return true
		case "inputResponses", "requestState":
			if !inputs {
				return true
			}
		}
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, k.Raw...)
		out = append(out, ':')
		out = append(out, v.Raw...)
		n++
		return true
	})
	return out, n, meta
}

// AppendForeignMeta appends to out, each after a comma, the members of
// the _meta object that are not MCP's own (io.modelcontextprotocol/…):
// the agent's and the server's, passed on whatever the era.
func AppendForeignMeta(out []byte, meta gjson.Result) []byte {
	meta.ForEach(func(k, v gjson.Result) bool {
		if !strings.HasPrefix(k.Str, "io.modelcontextprotocol/") {
			out = append(out, ',')
			out = append(out, k.Raw...)
			out = append(out, ':')
			out = append(out, v.Raw...)
		}
		return true
	})
	return out
}

// McpNameOf returns the Mcp-Name header value of a 2026-07-28 request.
func McpNameOf(method string, body []byte) string {
	switch method {
	case "tools/call", "prompts/get":
		return gjson.GetBytes(body, "params.name").Str
	case "resources/read":
		return gjson.GetBytes(body, "params.uri").Str
	}
	return ""
}
