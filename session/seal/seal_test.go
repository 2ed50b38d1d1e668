package seal

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
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
	f.Fuzz(func(t *testing.T, s string) {
		rec, err := r.Open(s, now)
		if err == nil && (rec.Upstream != "u" || !bytes.Equal(rec.Init, initBody)) {
			t.Fatalf("forged id %q opened", s)
		}
	})
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
