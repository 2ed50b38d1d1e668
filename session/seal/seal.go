// Package seal turns what never changes for an agent session into the
// session id the agent holds, and back: an AEAD-sealed, versioned record
// (docs/deployment.md "Sessions that outlive mcpheal"). Any mcpheal process with the key
// ring can open it, so a restarted process heals a session from its id
// alone; the id cannot be forged, read or altered by the agent.
//
// Format: "m" + base64url(version ‖ key id ‖ GCM nonce ‖ ciphertext+tag),
// with version and key id as associated data. The base64url is unpadded
// and canonical (RFC 4648 §3.5: the unused bits of the last character are
// zero; no padding, line breaks or other characters), so a sealed record
// has exactly one spelling and Open refuses every other. The plaintext is
// a binary record: a random nonce (the session's identity), issued-at and
// expiry, the upstream's name, a digest of the credential that created it,
// the negotiated protocol version, and the agent's initialize, deflated
// (or its SHA-256 when even deflated it would make the id too long).
//
// Keys are derived once per key (HKDF-SHA256), never per request; opening
// costs one AES-GCM open and one inflate (BenchmarkOpen).
//
// The package imports only the standard library.
package seal

import (
	"bytes"
	"compress/flate"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// version is the record format; it is authenticated with the key id.
const version = 1

// maxInit is the most deflated initialize a record carries; past it the
// record keeps the initialize's digest and the id stays under 2 KB.
const maxInit = 1200

// ErrInvalid is returned by Open for an id it cannot vouch for: malformed,
// tampered, sealed under a key the ring does not hold, or expired. The
// proxy answers all of them exactly as an unknown session.
var ErrInvalid = errors.New("invalid session id")

// Record is what never changes for a session.
type Record struct {
	// Nonce identifies the session; random.
	Nonce [16]byte
	// Issued and Expires bound the id's life (Unix seconds precision).
	Issued, Expires time.Time
	// Upstream names the upstream the session belongs to.
	Upstream string
	// Credential is CredentialDigest of the agent's credential at
	// initialize ("" for none).
	Credential string
	// Protocol is the negotiated MCP protocol version.
	Protocol string
	// Init is the agent's initialize body; InitDigest is its SHA-256. A
	// record opened from an id whose initialize was too large to seal has
	// Init nil (see Carried).
	Init       []byte
	InitDigest [32]byte

	zinit []byte // Init deflated, when it fits (NewRecord)
}

// Carried reports whether the sealed id carries the initialize itself
// rather than only its digest: false for an initialize that deflates to
// more than maxInit bytes. Without it, a process that opens the id needs
// the initialize from elsewhere (a fleet store) to re-create the session.
func (rec *Record) Carried() bool { return rec.Init != nil && rec.zinit != nil }

// CredentialDigest is how a record binds a credential: a SHA-256 prefix of
// the Authorization value. The record is encrypted, so the digest is never
// seen outside mcpheal; it is unkeyed so that it survives key rotation.
func CredentialDigest(auth []byte) string {
	if len(auth) == 0 {
		return ""
	}
	sum := sha256.Sum256(auth)
	return string(sum[:16])
}

// Key is one secret of the ring.
type Key struct {
	// ID names the key inside sealed ids: 1 to 255.
	ID byte
	// Secret is at least 32 bytes of key material.
	Secret []byte
}

// ParseKeys reads a key ring written as "id:secret[,id:secret...]", the
// secret in standard or URL base64 (at least 32 bytes). The first key seals;
// the others only open (older keys during a rotation).
func ParseKeys(s string) ([]Key, error) {
	var keys []Key
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		idStr, secret, ok := strings.Cut(part, ":")
		if !ok {
			return nil, errors.New("session key: want id:base64-secret")
		}
		var id int
		if _, err := fmt.Sscanf(idStr, "%d", &id); err != nil || id < 1 || id > 255 {
			return nil, fmt.Errorf("session key id %q: want 1 to 255", idStr)
		}
		b, err := base64.StdEncoding.DecodeString(secret)
		if err != nil {
			b, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(secret, "="))
		}
		if err != nil || len(b) < 32 {
			return nil, fmt.Errorf("session key %d: want at least 32 bytes of base64", id)
		}
		keys = append(keys, Key{ID: byte(id), Secret: b})
	}
	if len(keys) == 0 {
		return nil, errors.New("session keys: none given")
	}
	return keys, nil
}

// Ring seals with its first key and opens with any of its keys.
type Ring struct {
	sealID byte
	aeads  map[byte]cipher.AEAD
}

// NewRing derives one AES-256-GCM key per Key (HKDF-SHA256).
func NewRing(keys []Key) (*Ring, error) {
	if len(keys) == 0 {
		return nil, errors.New("seal: empty key ring")
	}
	r := &Ring{sealID: keys[0].ID, aeads: make(map[byte]cipher.AEAD, len(keys))}
	for _, k := range keys {
		if _, dup := r.aeads[k.ID]; dup {
			return nil, fmt.Errorf("seal: key id %d twice", k.ID)
		}
		dk, err := hkdf.Key(sha256.New, k.Secret, []byte("mcpheal session id"), "aes-256-gcm v1", 32)
		if err != nil {
			return nil, fmt.Errorf("seal: derive key %d: %w", k.ID, err)
		}
		block, err := aes.NewCipher(dk)
		if err != nil {
			return nil, err
		}
		a, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		r.aeads[k.ID] = a
	}
	return r, nil
}

// RandomRing returns a ring of one key made up now: ids it seals open only
// in this process.
func RandomRing() *Ring {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	r, _ := NewRing([]Key{{ID: 1, Secret: secret}})
	return r
}

// Seal returns the id for rec. rec.Nonce must be set (see NewRecord).
func (r *Ring) Seal(rec *Record) string {
	plain := rec.encode()
	a := r.aeads[r.sealID]
	buf := make([]byte, 2, 2+a.NonceSize()+len(plain)+a.Overhead())
	buf[0], buf[1] = version, r.sealID
	buf = buf[:2+a.NonceSize()]
	_, _ = rand.Read(buf[2:])
	buf = a.Seal(buf, buf[2:2+a.NonceSize()], plain, buf[:2])
	return "m" + base64.RawURLEncoding.EncodeToString(buf)
}

// strict decodes the one spelling Seal writes: it refuses padding and
// non-zero unused bits in the last character (RFC 4648 §3.5), though not
// the CR and LF that Go's decoders skip anywhere (see canonical).
var strict = base64.RawURLEncoding.Strict()

// canonical reports whether s is the very text Seal writes for raw. Every
// place that remembers an id (the graveyard, the Redis tombstone) keys its
// exact text, so a second spelling that opened the same record would bring
// an ended session back. Re-encoding is the definition of the one spelling,
// so it also catches whatever a decoder skips or tolerates beyond what
// strict refuses. It does not allocate: an id is at most 4096 bytes.
func canonical(s string, raw []byte) bool {
	var buf [4096]byte
	n := base64.RawURLEncoding.EncodedLen(len(raw))
	if n != len(s) || n > len(buf) {
		return false
	}
	base64.RawURLEncoding.Encode(buf[:n], raw)
	return string(buf[:n]) == s
}

// Open returns the record sealed in id, or ErrInvalid. It accepts exactly
// the spelling Seal wrote: any other text, even one a lenient base64
// decoder reads as the same bytes, is ErrInvalid.
func (r *Ring) Open(id string, now time.Time) (*Record, error) {
	if len(id) < 2 || id[0] != 'm' || len(id) > 4096 {
		return nil, ErrInvalid
	}
	raw, err := strict.DecodeString(id[1:])
	if err != nil || !canonical(id[1:], raw) || len(raw) < 2 || raw[0] != version {
		return nil, ErrInvalid
	}
	a, ok := r.aeads[raw[1]]
	if !ok || len(raw) < 2+a.NonceSize()+a.Overhead() {
		return nil, ErrInvalid
	}
	n := a.NonceSize()
	plain, err := a.Open(nil, raw[2:2+n], raw[2+n:], raw[:2])
	if err != nil {
		return nil, ErrInvalid
	}
	rec, err := decode(plain)
	if err != nil || !now.Before(rec.Expires) {
		return nil, ErrInvalid
	}
	return rec, nil
}

// NewRecord returns a record with a fresh nonce, issued now and valid for
// ttl, carrying the initialize deflated when it fits.
func NewRecord(upstream, credential, protocol string, init []byte, now time.Time, ttl time.Duration) *Record {
	rec := &Record{Issued: now, Expires: now.Add(ttl), Upstream: upstream, Credential: credential,
		Protocol: protocol, Init: init, InitDigest: sha256.Sum256(init)}
	if z := deflate(init); len(z) <= maxInit {
		rec.zinit = z
	}
	_, _ = rand.Read(rec.Nonce[:])
	return rec
}

// encode writes the plaintext: nonce, issued, expires, then length-prefixed
// upstream, credential, protocol, digest and the deflated initialize.
func (rec *Record) encode() []byte {
	b := make([]byte, 0, 128+len(rec.Init))
	b = append(b, rec.Nonce[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(rec.Issued.Unix()))
	b = binary.BigEndian.AppendUint64(b, uint64(rec.Expires.Unix()))
	for _, s := range []string{rec.Upstream, rec.Credential, rec.Protocol} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = append(b, rec.InitDigest[:]...)
	return append(b, rec.zinit...)
}

func decode(b []byte) (*Record, error) {
	rec := &Record{}
	if len(b) < 32 {
		return nil, ErrInvalid
	}
	copy(rec.Nonce[:], b)
	rec.Issued = time.Unix(int64(binary.BigEndian.Uint64(b[16:])), 0)
	rec.Expires = time.Unix(int64(binary.BigEndian.Uint64(b[24:])), 0)
	b = b[32:]
	var fields [3]string
	for i := range fields {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return nil, ErrInvalid
		}
		fields[i] = string(b[k : k+int(n)])
		b = b[k+int(n):]
	}
	rec.Upstream, rec.Credential, rec.Protocol = fields[0], fields[1], fields[2]
	if len(b) < 32 {
		return nil, ErrInvalid
	}
	copy(rec.InitDigest[:], b)
	if z := b[32:]; len(z) > 0 {
		init, err := inflate(z)
		if err != nil || sha256.Sum256(init) != rec.InitDigest {
			return nil, ErrInvalid
		}
		rec.Init, rec.zinit = init, z
	}
	return rec, nil
}

var writers = sync.Pool{New: func() any { w, _ := flate.NewWriter(io.Discard, flate.BestCompression); return w }}

func deflate(p []byte) []byte {
	var buf bytes.Buffer
	w := writers.Get().(*flate.Writer)
	defer writers.Put(w)
	w.Reset(&buf)
	_, _ = w.Write(p)
	_ = w.Close()
	return buf.Bytes()
}

var readers sync.Pool // of flate readers: each holds a 32 KiB window

// inflate decompresses z, refusing to produce more than 1 MiB (a sealed
// initialize is at most max_init_body).
func inflate(z []byte) ([]byte, error) {
	var r io.ReadCloser
	if v := readers.Get(); v != nil {
		r = v.(io.ReadCloser)
		_ = r.(flate.Resetter).Reset(bytes.NewReader(z), nil)
	} else {
		r = flate.NewReader(bytes.NewReader(z))
	}
	defer readers.Put(r)
	out, err := io.ReadAll(io.LimitReader(r, 1<<20+1))
	if err != nil || len(out) > 1<<20 {
		return nil, ErrInvalid
	}
	return out, nil
}
