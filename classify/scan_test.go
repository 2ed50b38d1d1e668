package classify

import "testing"

func TestMember(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		obj, key, want string
		ok             bool
	}{
		{`{"a":1,"b":"x"}`, "b", `"x"`, true},
		{`{"a":1,"b":"x"}`, "a", `1`, true},
		{`{ "a" : { "b" : [1,{"c":"}"}] } , "d":null}`, "d", `null`, true},
		{`{ "a" : { "b" : [1,{"c":"}"}] } , "d":null}`, "a", `{ "b" : [1,{"c":"}"}] }`, true},
		{`{"a":{"b":1}}`, "b", "", false}, // not a top-level member
		{`{"s":"q\"uo\\\\","t":true}`, "t", "true", true},
		{`{"a":1}, "b":2`, "b", "", false}, // stops at the closing brace
		{`{"a":"unterminated`, "a", `"unterminated`, true},
		{`{"a":`, "a", ``, true},
		{`{"a"`, "a", "", false},
		{`{"a`, "a", "", false},
		{`{`, "a", "", false},
		{`{}`, "a", "", false},
		{`{"a" 1}`, "a", "", false},
		{`{"a":1 "b":2}`, "b", "", false},
		{`{"\u0061":1}`, "a", "", false}, // keys are compared raw
		{`{"":1}`, "", "1", true},
	} {
		got, ok := member(tc.obj, tc.key)
		if got != tc.want || ok != tc.ok {
			t.Errorf("member(%q, %q) = %q, %v, want %q, %v", tc.obj, tc.key, got, ok, tc.want, tc.ok)
		}
	}
}

func TestStringEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    string
		want int
	}{
		{`"abc"x`, 5},
		{`"a\"b"x`, 6},
		{`"a\\"x`, 5},
		{`"a\\\"b"x`, 8},
		{`""`, 2},
		{`"abc`, 4},
		{`"a\"`, 4},
		{`"`, 1},
	} {
		if got := stringEnd(tc.s, 0); got != tc.want {
			t.Errorf("stringEnd(%q, 0) = %d, want %d", tc.s, got, tc.want)
		}
	}
}

func TestValueEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    string
		want int
	}{
		{`123,`, 3},
		{`-1.5e3}`, 6},
		{`true]`, 4},
		{`null`, 4},
		{`{"a":"}"},`, 9},
		{`[[],{}] `, 7},
		{`[`, 1},
		{``, 0},
	} {
		if got := valueEnd(tc.s, 0); got != tc.want {
			t.Errorf("valueEnd(%q, 0) = %d, want %d", tc.s, got, tc.want)
		}
	}
}

func TestMayHaveIsErrorTrue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{`{"isError":true}`, true},
		{`{"isError" : true}`, true},
		{`{"isError":false}`, false},
		{`{"isError":false,"a":{"isError":true}}`, true},
		{`{"text":"\"isError\": true"}`, false},
		{`{"wasError":true}`, false},
		{`{"error":true}`, false},
		{`{"isError" true}`, false},
		{`{"isError"`, true},
		{`{"isError":`, true},
		{`{}`, false},
	} {
		if got := mayHaveIsErrorTrue(tc.s); got != tc.want {
			t.Errorf("mayHaveIsErrorTrue(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

func TestIntCode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw  string
		want int
		ok   bool
	}{
		{"-32601", -32601, true},
		{"-32601.0", -32601, true},
		{"-32601.000", -32601, true},
		{"0", 0, true},
		{"32600", 32600, true},
		{"-32601.", 0, false},
		{"-32601.5", 0, false},
		{"-3.2601e4", 0, false},
		{"-", 0, false},
		{"", 0, false},
		{`"-32601"`, 0, false},
		{"1234567890", 0, false},
		{"--1", 0, false},
	} {
		got, ok := intCode(tc.raw)
		if got != tc.want || ok != tc.ok {
			t.Errorf("intCode(%q) = %d, %v, want %d, %v", tc.raw, got, ok, tc.want, tc.ok)
		}
	}
}

func TestFoldSet(t *testing.T) {
	t.Parallel()
	fs := newFoldSet("session not found", "expired session", "x-y")
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"Session not found", true},
		{"x: SESSION NOT FOUND.", true},
		{"unexpired session", true}, // anywhere, even inside a word
		{"session not foundation", true},
		{"session not", false},
		{"", false},
		{"\u00c0xpired session", false}, // no Unicode folding
		{"X-Y", true},
		{"x\x0dy", false}, // '\r'|0x20 == '-' must not confuse the scan
	} {
		if got := fs.in(tc.s); got != tc.want {
			t.Errorf("foldSet.in(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

func TestWholeSet(t *testing.T) {
	t.Parallel()
	ws := newWholeSet("session not found", "invalid params: invalid or expired session")
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"session not found", true},
		{"Session Not Found", true},
		{"SESSION NOT FOUND.", true},
		{"  Session not found \r\n", true},
		{`\nSession not found\n`, true}, // JSON-escaped whitespace
		{`\tSession not found.\r\n`, true},
		{"Invalid params: Invalid or expired session", true},
		{"Session not found..", false},
		{"Session not found .", false},
		{`Session not found\\n`, false}, // an escaped backslash, then n
		{"Session not found: 1234", false},
		{"Error: Session not found", false},
		{"charged $20 but payment gateway session not found", false},
		{"session not foun", false},
		{"session not found" + "\u00e9", false},
		{"session\tnot found", false},
		{"", false},
		{".", false},
	} {
		if got := ws.is(tc.s); got != tc.want {
			t.Errorf("wholeSet.is(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

func TestNewWholeSetRejects(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"", "Upper", "caf\u00e9", " padded", "period.", "escaped\\n"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("newWholeSet(%q) did not panic", m)
				}
			}()
			newWholeSet(m)
		}()
	}
}

func TestNewFoldSetRejects(t *testing.T) {
	t.Parallel()
	for _, phrases := range [][]string{
		{""},
		{"Upper"},
		{"caf\u00e9"},
		{"1", "2", "3", "4", "5", "6", "7", "8", "9"},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("newFoldSet(%q) did not panic", phrases)
				}
			}()
			newFoldSet(phrases...)
		}()
	}
}

func TestTrimLeft(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ s, want string }{
		{bom + " \r\n\t" + bom + "{", "{"},
		{"\xEF\xBB", "\xEF\xBB"}, // a partial BOM stays
		{"", ""},
		{"x ", "x "},
	} {
		if got := trimLeft(tc.s); got != tc.want {
			t.Errorf("trimLeft(%q) = %q, want %q", tc.s, got, tc.want)
		}
	}
}
