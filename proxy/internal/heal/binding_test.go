package heal

import (
	"testing"

	"github.com/mcpheal/mcpheal/session"
)

// BenchmarkStanding is the per-request cost of checking a session's
// credential binding (binding.go): the credential the session holds costs
// a string compare; a rotated JWT of the same subject, a digest of its
// principal.
func BenchmarkStanding(b *testing.B) {
	auth := []byte("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyLTEiLCJpc3MiOiJodHRwczovL2lkcCJ9.abcdefabcdef")
	rotated := []byte("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyLTEiLCJpc3MiOiJodHRwczovL2lkcCIsImV4cCI6OX0.ghijkl")
	sess := session.New("id", session.Recipe{Credential: BindingOf(auth), Header: [][2]string{{"Authorization", string(auth)}}}, "up")
	for _, c := range []struct {
		name string
		auth []byte
	}{{"same", auth}, {"rotated-jwt", rotated}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if st, _ := StandingOf(sess, c.auth, false); st != Bound {
					b.Fatal("not bound")
				}
			}
		})
	}
}
