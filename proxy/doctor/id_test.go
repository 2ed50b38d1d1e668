package doctor

import "testing"

// TestDoctorIDShape: shapes of the session ids seen in the wild
// (go-sdk, the Python and TypeScript SDKs, mcp-go, prefixed and JWT-like
// ids), and lookalike ids keep the shape but differ.
func TestDoctorIDShape(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, id string
		want     IDShape
	}{
		{"go-sdk rand.Text", "Q2WBHRFSN4GHJ3LK7XKFW4UDNA", IDShape{26, "", "base32"}},
		{"python uuid hex", "5f0c8e3b2a1d4c6e9b7a8f0e1d2c3b4a", IDShape{32, "", "hex"}},
		{"uuid", "5f0c8e3b-2a1d-4c6e-9b7a-8f0e1d2c3b4a", IDShape{36, "", "uuid"}},
		{"mcp-go", "mcp-session-5f0c8e3b-2a1d-4c6e-9b7a-8f0e1d2c3b4a", IDShape{48, "mcp-session-", "uuid"}},
		{"prefixed alnum", "sess_Ab3dEf9hIjK1mNoPqR7t", IDShape{25, "sess_", "alphanumeric"}},
		{"jwt-like", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc-_def", IDShape{45, "", "visible ASCII"}},
		{"base64url", "Ab-_cdEFgh12ijKLmn34", IDShape{20, "", "base64url"}},
		{"base64url, lower start", "ab-_cdEFgh12ijKLmn34", IDShape{20, "", "base64url"}},
		{"two-letter word", "ab-cdEFgh12ijKLmn34xyz", IDShape{22, "", "base64url"}},
		{"upper hex", "5F0C8E3B2A1D4C6E9B7A8F0E1D2C3B4A", IDShape{32, "", "hex"}},
		{"control byte", "abc\x01def", IDShape{7, "", "invalid"}},
	}
	for _, tc := range cases {
		if got := shapeOf(tc.id); got != tc.want {
			t.Errorf("shapeOf(%s) = %+v, want %+v", tc.name, got, tc.want)
		}
		if tc.want.Charset == "invalid" || tc.want.Charset == "visible ASCII" {
			continue
		}
		for range 200 { // random: try many
			fake := lookalike(tc.id)
			if fake == tc.id || shapeOf(fake) != tc.want {
				t.Fatalf("lookalike(%s) = %q (shape %+v), want another id of shape %+v", tc.name, fake, shapeOf(fake), tc.want)
			}
		}
	}
}
