package bench

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"
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
// or the data of the first SSE event that is a response (has "result" or
// "error"), whatever the Content-Type said.
func Answer(body []byte) []byte {
	t := bytes.TrimLeft(body, " \t\r\n\ufeff")
	if len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		return t
	}
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		line = bytes.TrimRight(line, "\r")
		d, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		d = bytes.TrimSpace(d)
		if bytes.Contains(d, []byte(`"result"`)) || bytes.Contains(d, []byte(`"error"`)) {
			return d
		}
	}
	return nil
}
