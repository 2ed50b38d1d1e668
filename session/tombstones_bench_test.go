package session

import (
	"testing"
	"time"
)

// BenchmarkTombstones is the cost of a DELETE's Bury and of the Buried
// every restore from a sealed id asks, with 65 600 ids in the window.
func BenchmarkTombstones(b *testing.B) {
	now := epoch
	ts := tombstonesAt(24*time.Hour, &now)
	exp := now.Add(time.Hour)
	ids := make([][16]byte, 1<<16)
	for i := range ids {
		ids[i] = nonce()
	}
	for i := range 65_600 {
		ts.Bury(ids[i%len(ids)], exp)
	}
	b.Run("Bury", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			ts.Bury(ids[i%len(ids)], exp)
			i++
		}
		b.ReportMetric(float64(ts.Bytes()), "held-bytes")
	})
	b.Run("Buried", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			ts.Buried(ids[i%len(ids)], exp, now)
			i++
		}
		b.ReportMetric(float64(ts.Bytes()), "held-bytes")
	})
	b.Run("NotBuried", func(b *testing.B) {
		other := nonce()
		b.ReportAllocs()
		for b.Loop() {
			other[0]++
			ts.Buried(other, exp, now)
		}
		b.ReportMetric(float64(ts.Bytes()), "held-bytes")
	})
}
