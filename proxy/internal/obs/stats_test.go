package obs

import (
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

import "testing"

func TestMethodIndex(t *testing.T) {
	t.Parallel()
	for i, name := range MethodNames[1:15] {
		if got := methodIndex(&wire.Message{Method: name, ID: "1"}); got != i+1 {
			t.Errorf("methodIndex(%s) = %d, want %d", name, got, i+1)
		}
	}
	for m, want := range map[*wire.Message]string{
		{Method: "x/y", ID: "1"}:              "other",
		{Method: "notifications/initialized"}: "notification",
		{ID: "3"}:                             "response",
		{Get: true}:                           "GET",
		{Batch: true}:                         "other",
	} {
		if got := MethodNames[methodIndex(m)]; got != want {
			t.Errorf("methodIndex(%+v) = %s, want %s", *m, got, want)
		}
	}
}
