package obs

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// The hot path counts each request by (method, class). These benchmarks are
// why the proxy counts with plain atomics and lets client_golang read them
// at scrape time (collector), instead of updating client_golang vectors per
// request.
func BenchmarkCountRequest(b *testing.B) {
	m := &wire.Message{Method: "tools/call", ID: "1"}
	b.Run("atomics", func(b *testing.B) {
		var c Counters
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Request(m, classify.OK)
			}
		})
	})
	b.Run("client_golang_vec", func(b *testing.B) {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total"}, []string{"upstream", "method", "class"})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				v.WithLabelValues("default", m.Method, classify.OK.String()).Inc()
			}
		})
	})
}
