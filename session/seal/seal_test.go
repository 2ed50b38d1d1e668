package seal

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func ring(t testing.TB, keys ...Key) *Ring {
	t.Helper()
	r, err := NewRing(keys)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func key(id byte) Key {
	s := make([]byte, 32)
	_, _ = rand.Read(s)
	return Key{ID: id, Secret: s}
}

var initBody = []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{"listChanged":true},"sampling":{},"elicitation":{}},"clientInfo":{"name":"claude-code","version":"2.1.0"}}}`)

func TestSealOpen(t *testing.T) {
	t.Parallel()
	r := ring(t, key(1))
	now := time.Unix(1_800_000_000, 0)
	rec := NewRecord("wordpress", CredentialDigest([]byte("Bearer tok")), "2025-11-25", initBody, now, 24*time.Hour)
	id := r.Seal(rec)
	if len(id) >= 2048 {
		t.Fatalf("id is %d bytes, want under 2 KB", len(id))
	}
	for _, c := range []byte(id) {
		if c < 0x21 || c > 0x7e {
			t.Fatalf("id holds %q: not visible ASCII", c)
		}
	}
	got, err := r.Open(id, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if got.Nonce != rec.Nonce || got.Upstream != "wordpress" || got.Credential != rec.Credential ||
		got.Protocol != "2025-11-25" || !bytes.Equal(got.Init, initBody) || !got.Expires.Equal(rec.Expires) {
		t.Fatalf("Open = %+v, want %+v", got, rec)
	}
	t.Logf("a %d-byte initialize seals into a %d-byte id", len(initBody), len(id))
}

// TestOpenRefuses: a tampered, foreign-key, truncated or expired id opens
// as ErrInvalid, exactly as garbage does.
func TestOpenRefuses(t *testing.T) {
	t.Parallel()
	r := ring(t, key(1))
	now := time.Unix(1_800_000_000, 0)
	id := r.Seal(NewRecord("u", "", "2025-11-25", initBody, now, time.Hour))
	raw, _ := base64.RawURLEncoding.DecodeString(id[1:])
	flip := func(i int) string {
		b := bytes.Clone(raw)
		b[i] ^= 1
		return "m" + base64.RawURLEncoding.EncodeToString(b)
	}
	foreign := ring(t, key(1)).Seal(NewRecord("u", "", "2025-11-25", initBody, now, time.Hour))
	cases := map[string]string{
		"tampered ciphertext": flip(len(raw) - 20),
		"tampered tag":        flip(len(raw) - 1),
		"tampered key id":     flip(1),
		"tampered version":    flip(0),
		"foreign key":         foreign,
		"truncated":           id[:len(id)-10],
		"garbage":             "0123456789abcdef0123456789abcdef",
		"empty":               "",
		"not base64":          "m!!!!",
	}
	for name, bad := range cases {
		if _, err := r.Open(bad, now); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Open = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := r.Open(id, now.Add(time.Hour)); !errors.Is(err, ErrInvalid) {
		t.Errorf("expired: Open = %v, want ErrInvalid", err)
	}
}

// sealTail seals a record whose bytes are tail more than a multiple of 3
// long, so that the id's last base64 character carries 0 (tail 0), 4
// (tail 1) or 2 (tail 2) unused low bits.
func sealTail(t *testing.T, r *Ring, now time.Time, tail int) (id string, raw []byte) {
	t.Helper()
	for n := range 3 {
		id = r.Seal(NewRecord(strings.Repeat("u", 1+n), "", "2025-11-25", initBody, now, time.Hour))
		raw, _ = base64.RawURLEncoding.DecodeString(id[1:])
		if len(raw)%3 == tail {
			return id, raw
		}
	}
	t.Fatalf("no upstream name gives a record of length %d mod 3", tail)
	return "", nil
}

// spellings returns every other text for id that a lenient decoder reads as
// the same bytes, with that decoder: other unused low bits in the last
// character, CR and LF (which Go's decoders skip anywhere), and padding.
func spellings(id string, raw []byte) map[string]struct {
	text string
	lax  *base64.Encoding
} {
	type spelling = struct {
		text string
		lax  *base64.Encoding
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	body, last := id[:len(id)-1], strings.IndexByte(alphabet, id[len(id)-1])
	unused := [3]int{0, 4, 2}[len(raw)%3]
	pad := strings.Repeat("=", (4-len(id[1:])%4)%4)
	out := map[string]spelling{
		"LF at the end":      {id + "\n", base64.RawURLEncoding},
		"CRLF at the end":    {id + "\r\n", base64.RawURLEncoding},
		"LF after the m":     {"m\n" + id[1:], base64.RawURLEncoding},
		"CR in the middle":   {id[:len(id)/2] + "\r" + id[len(id)/2:], base64.RawURLEncoding},
		"wrapped at 76":      {"m" + wrap(id[1:], 76), base64.RawURLEncoding},
		"padded, then CRLF":  {id + pad + "\r\n", base64.URLEncoding},
		"LF inside padding":  {id + pad[:len(pad)/2] + "\n" + pad[len(pad)/2:], base64.URLEncoding},
		"padded":             {id + pad, base64.URLEncoding},
		"padded, other bits": {body + string(alphabet[last|1]) + pad, base64.URLEncoding},
	}
	if pad == "" {
		// Nothing to pad and no unused bits: only the line breaks remain.
		delete(out, "padded")
		delete(out, "padded, then CRLF")
		delete(out, "LF inside padding")
		delete(out, "padded, other bits")
	}
	for bits := 1; bits < 1<<unused; bits++ {
		out[fmt.Sprintf("unused bits %0*b", unused, bits)] = spelling{body + string(alphabet[last|bits]), base64.RawURLEncoding}
	}
	return out
}

func wrap(s string, width int) string {
	var b strings.Builder
	for len(s) > width {
		b.WriteString(s[:width] + "\r\n")
		s = s[width:]
	}
	b.WriteString(s)
	return b.String()
}

// TestOpenOneSpelling: an id has exactly one accepted text. The graveyard
// and the Redis tombstone key an ended id's exact text, so any other
// spelling that opened the same record would bring the session back.
func TestOpenOneSpelling(t *testing.T) {
	t.Parallel()
	r := ring(t, key(1))
	now := time.Unix(1_800_000_000, 0)
	for tail := range 3 {
		t.Run(fmt.Sprintf("length %d mod 3", tail), func(t *testing.T) {
			id, raw := sealTail(t, r, now, tail)
			if _, err := r.Open(id, now); err != nil {
				t.Fatalf("Open(%q) = %v, want nil", id, err)
			}
			others := spellings(id, raw)
			if want := [3]int{5, 9 + 15, 9 + 3}[tail]; len(others) != want {
				t.Fatalf("%d other spellings, want %d", len(others), want)
			}
			for name, sp := range others {
				t.Run(name, func(t *testing.T) {
					// First show that it is a spelling of the same bytes,
					// not merely garbage.
					if got, err := sp.lax.DecodeString(sp.text[1:]); err != nil || !bytes.Equal(got, raw) || sp.text == id {
						t.Fatalf("lenient decode of %q = %v, want the sealed bytes under another text", sp.text, err)
					}
					if rec, err := r.Open(sp.text, now); !errors.Is(err, ErrInvalid) {
						t.Errorf("Open(%q) = %v, %v, want ErrInvalid", sp.text, rec, err)
					}
				})
			}
		})
	}
}

// TestRotation: a ring whose first key is new seals with it and still opens
// ids sealed under the older key; once the old key leaves the ring, its ids
// no longer open.
func TestRotation(t *testing.T) {
	t.Parallel()
	k1, k2 := key(1), key(2)
	now := time.Unix(1_800_000_000, 0)
	old := ring(t, k1).Seal(NewRecord("u", "", "v", initBody, now, time.Hour))
	rotated := ring(t, k2, k1)
	if _, err := rotated.Open(old, now); err != nil {
		t.Fatalf("old id under the rotated ring: %v", err)
	}
	fresh := rotated.Seal(NewRecord("u", "", "v", initBody, now, time.Hour))
	if _, err := ring(t, k2).Open(fresh, now); err != nil {
		t.Fatalf("new id sealed with the new key: %v", err)
	}
	if _, err := ring(t, k2).Open(old, now); !errors.Is(err, ErrInvalid) {
		t.Fatalf("old id after the old key left: %v", err)
	}
}

// TestLargeInitializeKeepsDigest: an initialize too large to seal leaves a
// short id carrying only its digest.
func TestLargeInitializeKeepsDigest(t *testing.T) {
	t.Parallel()
	r := ring(t, key(7))
	big := make([]byte, 64<<10)
	_, _ = rand.Read(big) // incompressible
	now := time.Unix(1_800_000_000, 0)
	rec := NewRecord("u", "", "v", big, now, time.Hour)
	id := r.Seal(rec)
	got, err := r.Open(id, now)
	if err != nil || got.Init != nil || got.InitDigest != rec.InitDigest || len(id) > 512 {
		t.Fatalf("Open = %v, %v; id %d bytes", got, err, len(id))
	}
}

func TestParseKeys(t *testing.T) {
	t.Parallel()
	secret := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	keys, err := ParseKeys("2:" + secret + ", 1:" + strings.TrimRight(base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{9}, 40)), "="))
	if err != nil || len(keys) != 2 || keys[0].ID != 2 || keys[1].ID != 1 {
		t.Fatalf("ParseKeys = %v, %v", keys, err)
	}
	for _, bad := range []string{"", "1", "0:" + secret, "300:" + secret, "1:c2hvcnQ="} {
		if _, err := ParseKeys(bad); err == nil {
			t.Errorf("ParseKeys(%q) accepted", bad)
		}
	}
	if _, err := NewRing([]Key{key(1), key(1)}); err == nil {
		t.Error("a ring with one key id twice")
	}
}

func FuzzOpen(f *testing.F) {
	r := ring(f, key(1))
	now := time.Unix(1_800_000_000, 0)
	id := r.Seal(NewRecord("u", "c", "v", initBody, now, time.Hour))
	f.Add(id)
	f.Add("m")
	raw, _ := base64.RawURLEncoding.DecodeString(id[1:])
	for _, sp := range spellings(id, raw) {
		f.Add(sp.text)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rec, err := r.Open(s, now)
		if err != nil {
			return
		}
		if rec.Upstream != "u" || !bytes.Equal(rec.Init, initBody) {
			t.Fatalf("forged id %q opened", s)
		}
		// An id that opens is the one spelling of its bytes: read leniently
		// and written back, it is the same text.
		b, err := base64.URLEncoding.DecodeString(padded(s[1:]))
		if err != nil || "m"+base64.RawURLEncoding.EncodeToString(b) != s {
			t.Fatalf("Open(%q) opened a spelling that is not canonical", s)
		}
	})
}

// padded pads s for base64.URLEncoding, the most lenient of Go's URL
// decoders: it also takes padding and skips CR and LF.
func padded(s string) string {
	n := len(strings.NewReplacer("\r", "", "\n", "").Replace(s))
	if strings.HasSuffix(s, "=") {
		return s
	}
	return s + strings.Repeat("=", (4-n%4)%4)
}

// BenchmarkOpen is the cost of a session-store miss: unsealing an id.
func BenchmarkOpen(b *testing.B) {
	r := ring(b, key(1))
	now := time.Unix(1_800_000_000, 0)
	id := r.Seal(NewRecord("wordpress", CredentialDigest([]byte("Bearer tok")), "2025-11-25", initBody, now, 24*time.Hour))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Open(id, now); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSeal(b *testing.B) {
	r := ring(b, key(1))
	now := time.Unix(1_800_000_000, 0)
	b.ReportAllocs()
	for b.Loop() {
		_ = r.Seal(NewRecord("wordpress", "", "2025-11-25", initBody, now, 24*time.Hour))
	}
}
