package doctor

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// pieces returns a reader that hands out s cut at the given offsets, one
// piece per Read, as a server writing and flushing in pieces does.
func pieces(s string, at ...int) io.Reader {
	var rs []io.Reader
	from := 0
	for _, i := range at {
		rs = append(rs, strings.NewReader(s[from:i]))
		from = i
	}
	return io.MultiReader(append(rs, strings.NewReader(s[from:]))...)
}

// TestReadAnswer: the response is the data of the first complete SSE event
// that is a JSON-RPC response, however the stream is cut into reads; an
// event the stream ends inside is never taken for one.
func TestReadAnswer(t *testing.T) {
	t.Parallel()
	const resp = `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`
	// two's first read ends inside its data line, after "result": an
	// unfinished event there is not the answer (it once cut tools/list).
	const two = `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"},{"name":"b"}]}}`
	crlf := "event: message\r\ndata: " + resp + "\r\n\r\n"
	big := strings.Repeat("x", readLimit)
	cases := []struct {
		name    string
		sse     bool
		r       io.Reader
		want    string // msg
		wantErr error  // nil: none; errAny: some error
	}{
		{"json", false, strings.NewReader(resp), resp, nil},
		{"sse", true, strings.NewReader("event: message\ndata: " + resp + "\n\n"), resp, nil},
		{"sse one byte per read", true, iotest.OneByteReader(strings.NewReader("data: " + resp + "\n\n")), resp, nil},
		{"sse crlf split between CR and LF of the blank line", true, pieces(crlf, len(crlf)-1), resp, nil},
		{"sse crlf split inside the data", true, pieces(crlf, 30, len(crlf)-2), resp, nil},
		{"sse lone CR line ends", true, strings.NewReader("data: " + resp + "\r\r"), resp, nil},
		{"priming event first", true, strings.NewReader("id: 0\ndata:\n\nid: 1\ndata: " + resp + "\n\n"), resp, nil},
		{"notification and server request first", true, strings.NewReader(
			"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"result\":1}}\n\n" +
				"data: {\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"sampling/createMessage\",\"params\":{}}\n\n" +
				"data: " + resp + "\n\n"), resp, nil},
		{"data over two lines", true, strings.NewReader("data: {\"jsonrpc\":\"2.0\",\"id\":1,\ndata: \"result\":{}}\n\n"),
			"{\"jsonrpc\":\"2.0\",\"id\":1,\n\"result\":{}}", nil},
		{"response after the first read", true, pieces("data: "+resp+"\n\n", 20), resp, nil},
		{"event unfinished at EOF", true, strings.NewReader("data: " + resp + "\n"), "", errCut},
		{"response split mid-line", true, pieces("data: "+two+"\n\n", 40), two, nil},
		{"stream without a response", true, strings.NewReader("data: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n\n"), "", nil},
		{"sse event past the limit", true, strings.NewReader("data: " + big), "", errTooLarge},
		{"json past the limit", false, strings.NewReader(big + "x"), "", errTooLarge},
		{"reset mid-event", true, io.MultiReader(strings.NewReader("data: "+resp), iotest.ErrReader(io.ErrUnexpectedEOF)), "", io.ErrUnexpectedEOF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, msg, err := readAnswer(tc.r, tc.sse)
			if string(msg) != tc.want || !errors.Is(err, tc.wantErr) {
				t.Errorf("readAnswer(%s) = %.80q, %v; want %.80q, %v", tc.name, msg, err, tc.want, tc.wantErr)
			}
		})
	}
}
