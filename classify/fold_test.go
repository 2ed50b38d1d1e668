package classify

import "testing"

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
