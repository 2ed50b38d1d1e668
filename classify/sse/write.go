package sse

// Writing events. Every event mcpheal writes to an agent goes through these
// functions, so that the one rule of writing lives in one place: a field
// value never holds a line end. Data that does (a message a server split
// over several data lines, which the reader joined with LF) is written as
// one data line per line, which a reader joins back to the same data
// (§9.2.6: each data line's value is appended, then LF).

// AppendField appends one field line, "name: value" and LF. value must
// hold no line end (CR or LF); AppendEvent splits data that may.
func AppendField(dst []byte, name string, value []byte) []byte {
	dst = AppendFieldName(dst, name)
	dst = append(dst, value...)
	return append(dst, '\n')
}

// AppendFieldName appends the start of a field line: its name and the
// separator. The caller appends the value (holding no line end) and the
// line end: a relay that rewrites a line keeps the line end it came with.
func AppendFieldName(dst []byte, name string) []byte {
	dst = append(dst, name...)
	return append(dst, ':', ' ')
}

// AppendEvent appends one whole event: an event field when name is not
// empty, data as one data line per line of it (split at LF, CRLF and lone
// CR), and the blank line that ends the event. Empty data gives one empty
// data line, which a reader takes as empty data.
func AppendEvent(dst []byte, name string, data []byte) []byte {
	if name != "" {
		dst = AppendField(dst, "event", []byte(name))
	}
	for {
		i := lineEnd(data)
		if i < 0 {
			dst = AppendField(dst, "data", data)
			break
		}
		dst = AppendField(dst, "data", data[:i])
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	return append(dst, '\n')
}

// AppendComment appends a comment line and a blank line: an event that a
// reader ignores, which keeps an idle stream's connection alive. text must
// hold no line end.
func AppendComment(dst []byte, text string) []byte {
	dst = append(dst, ':', ' ')
	dst = append(dst, text...)
	return append(dst, '\n', '\n')
}
