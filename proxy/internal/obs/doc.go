// Package obs is what mcpheal tells the operator: the counters behind
// /metrics and Stats (Counters), the spans of OpenTelemetry traces
// (Tracing), and the log fields' one spelling. It imports only conf and
// wire; every stage above counts and traces through it, and it never
// decides anything.
package obs
