package proxy

import "testing"

func TestMethodIndex(t *testing.T) {
	t.Parallel()
	for i, name := range methodNames[1:15] {
		if got := methodIndex(&message{method: name, id: "1"}); got != i+1 {
			t.Errorf("methodIndex(%s) = %d, want %d", name, got, i+1)
		}
	}
	for m, want := range map[*message]string{
		{method: "x/y", id: "1"}:              "other",
		{method: "notifications/initialized"}: "notification",
		{id: "3"}:                             "response",
		{get: true}:                           "GET",
		{batch: true}:                         "other",
	} {
		if got := methodNames[methodIndex(m)]; got != want {
			t.Errorf("methodIndex(%+v) = %s, want %s", *m, got, want)
		}
	}
}
