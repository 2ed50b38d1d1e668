package bench

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/classify/sse"
)

// Errors of CheckEcho.
var (
	errNoAnswer = errors.New("no JSON-RPC answer in body")
	errNoEcho   = errors.New("answer is not the echo of its request")
)

// CheckEcho checks that body (JSON, or an SSE stream) holds the successful
// echo of a CallBody request and returns that request's id: the answer's id
// must be a number n and its first text content must be "bench-n".
func CheckEcho(body []byte) (uint64, error) {
	d := Answer(body)
	if d == nil {
		return 0, fmt.Errorf("%w: %.120q", errNoAnswer, body)
	}
	id := gjson.GetBytes(d, "id")
	if id.Type != gjson.Number {
		return 0, fmt.Errorf("%w: id %s in %.200s", errNoEcho, id.Raw, d)
	}
	n, err := strconv.ParseUint(id.Raw, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: id %s", errNoEcho, id.Raw)
	}
	if text := gjson.GetBytes(d, "result.content.0.text"); text.Str != "bench-"+id.Raw {
		return n, fmt.Errorf("%w: id %d in %.200s", errNoEcho, n, d)
	}
	return n, nil
}

// Answer returns the JSON-RPC answer in body: body itself when it is JSON,
// or the data of the first complete SSE event (ended by its blank line)
// that is a JSON-RPC response, whatever the Content-Type said. An event the
// body ends inside is no answer, so an answer cut short fails the check.
// The result is valid as long as body is.
func Answer(body []byte) []byte {
	t := bytes.TrimLeft(body, " \t\r\n\ufeff")
	if len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		return t
	}
	var f sse.Framer // no Max: Next never fails
	f.Feed(body)
	for {
		ev, ok, _ := f.Next()
		if !ok {
			return nil
		}
		if d := sse.Data(nil, ev); isResponse(d) {
			return d
		}
	}
}

// isResponse reports whether d is a JSON-RPC response: an object with a
// result or an error and no method (JSON-RPC 2.0 §5; a notification or a
// server request on the same stream has a method).
func isResponse(d []byte) bool {
	m := gjson.ParseBytes(d)
	return m.IsObject() && !m.Get("method").Exists() && (m.Get("result").Exists() || m.Get("error").Exists())
}
