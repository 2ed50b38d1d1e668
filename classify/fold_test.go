package classify

import "testing"

func TestFoldSet(t *testing.T) {
	t.Parallel()
	fs := newFoldSet("session not found", "expired session", "x-y")
	for _, tc := range []struct {
		s     string
		whole bool
		want  bool
	}{
		{"Session not found", true, true},
		{"x: SESSION NOT FOUND.", true, true},
		{"unexpired session", true, false},
		{"unexpired session", false, true},
		{"unexpired session, then expired session", true, true},
		{"session not found2", true, false},
		{"session not found_", true, false},
		{"session not foundation", false, true},
		{`error:\nsession not found`, true, true},
		{`error:nsession not found`, true, false},
		{"session not", true, false},
		{"", false, false},
		{"Session not found\u00e9", true, true}, // non-ASCII is not a word byte
		{"\u00c0xpired session", false, false},  // no Unicode folding
		{"X-Y", true, true},
		{"x\x0dy", false, false}, // '\r'|0x20 == '-' must not confuse the scan
	} {
		if got := fs.in(tc.s, tc.whole); got != tc.want {
			t.Errorf("foldSet.in(%q, %v) = %v, want %v", tc.s, tc.whole, got, tc.want)
		}
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
