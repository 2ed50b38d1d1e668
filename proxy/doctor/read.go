package doctor

// Reading one answer: the only place the doctor frames SSE, with the
// project's one framer (classify/sse).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/classify/sse"
)

// readLimit caps how much of one answer the doctor reads (1 MiB): a
// tools/list of a few hundred tools fits many times over.
const readLimit = 1 << 20

// Errors of readAnswer. Each means the answer holds no complete JSON-RPC
// response the doctor may count from.
var (
	errTooLarge = fmt.Errorf("answer exceeds %d bytes without a complete response", readLimit)
	errCut      = errors.New("stream ended inside an event")
)

// post sends one JSON-RPC message and returns the answer, the JSON-RPC
// response in it (the JSON body, or the data of the first SSE event that is
// a response; nil if there is none) and the response headers.
func (d *prober) post(ctx context.Context, sid, version, method, body string) (Answer, []byte, http.Header) {
	_, a, msg, h := d.exchange(ctx, sid, version, method, body)
	return a, msg, h
}

// exchange is post that also returns the raw bytes read (the whole JSON
// body, or the SSE stream up to the event that holds the response).
func (d *prober) exchange(ctx context.Context, sid, version, method, body string) (raw []byte, a Answer, msg []byte, h http.Header) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	resp, err := d.do(ctx, func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		d.headers(req, sid, version)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Method", method) // 2026-07-28 standard header; ignored before
		return req, nil
	})
	if err != nil {
		return nil, Answer{Err: err.Error()}, nil, http.Header{}
	}
	defer resp.Body.Close()
	a = Answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type")}
	raw, msg, err = readAnswer(resp.Body, isEventStream(a.ContentType))
	if err != nil {
		a.Err = "reading answer: " + err.Error()
	}
	a.Body = printable(raw)
	return raw, a, msg, resp.Header
}

// headers sets the caller's headers and the session headers on req.
func (d *prober) headers(req *http.Request, sid, version string) {
	for k, vs := range d.hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	if version != "" {
		req.Header.Set("MCP-Protocol-Version", version)
	}
}

// readAnswer reads one answer to a POST. A JSON body is read whole and is
// the response. An SSE body (a POST stream may carry notifications and
// server requests first) is read until its first complete event, ended by
// its blank line, whose data is a JSON-RPC response; that data is msg. raw
// is every byte read, at most readLimit+1 of them.
//
// msg is nil when err is set: a response read in part is never returned,
// because counting from it reports what was cut off as absent.
func readAnswer(r io.Reader, eventStream bool) (raw, msg []byte, err error) {
	lr := io.LimitReader(r, readLimit+1)
	if !eventStream {
		raw, err = io.ReadAll(lr)
		switch {
		case err != nil:
			return raw, nil, err
		case len(raw) > readLimit:
			return raw, nil, errTooLarge
		}
		return raw, raw, nil
	}
	f := sse.Framer{Max: readLimit}
	buf := make([]byte, 32<<10)
	for {
		n, rerr := lr.Read(buf)
		raw = append(raw, buf[:n]...)
		f.Feed(buf[:n])
		if msg, err = firstResponse(&f); msg != nil || err != nil {
			return raw, msg, err
		}
		switch {
		case len(raw) > readLimit:
			return raw, nil, errTooLarge
		case errors.Is(rerr, io.EOF) && f.Buffered() > 0:
			return raw, nil, errCut
		case errors.Is(rerr, io.EOF):
			return raw, nil, nil // a stream with no response: raw shows what it held
		case rerr != nil:
			return raw, nil, rerr
		}
	}
}

// firstResponse returns a copy of the data of the first complete event f
// holds that is a JSON-RPC response, or nil; events before it are dropped.
func firstResponse(f *sse.Framer) ([]byte, error) {
	for {
		ev, ok, err := f.Next()
		if err != nil { // sse.ErrTooLarge, the only one: an event past readLimit
			return nil, errTooLarge
		}
		if !ok {
			return nil, nil
		}
		if d := sse.Data(nil, ev); isResponse(d) {
			return bytes.Clone(d), nil
		}
	}
}

// isResponse reports whether d is a JSON-RPC response: an object with a
// result or an error and no method (JSON-RPC 2.0 §5; a server request or
// notification on the same stream has a method).
func isResponse(d []byte) bool {
	m := gjson.ParseBytes(d)
	return m.IsObject() && !m.Get("method").Exists() && (m.Get("result").Exists() || m.Get("error").Exists())
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct string) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream")
}

// printable returns a one-line prefix of b fit for a terminal: at most 200
// bytes, control characters shown as spaces.
func printable(b []byte) string {
	const limit = 200
	cut := len(b) > limit
	if cut {
		b = b[:limit]
	}
	b = bytes.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, b)
	s := strings.TrimSpace(string(b))
	if cut {
		s += "…"
	}
	return s
}
