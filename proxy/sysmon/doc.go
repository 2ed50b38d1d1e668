// Package sysmon keeps the Go runtime's system monitor (sysmon) out of deep
// sleep in a serving mcpheal process, which roughly halves the scheduler's
// system calls per request at the light, steady load a sidecar sees.
//
// Why: when every P is idle, sysmon parks on a futex. The next goroutine to
// enter a system call (every socket read and write of a request) finds it
// parked, wakes it with a futex call, and sysmon, betting that more work
// follows, starts over with 20 µs sleeps (nanosleep) before it parks again
// (runtime/proc.go, func sysmon). A proxy at 2000 requests a second is idle
// between most requests, so it pays this wake-up cycle again and again:
// measured on mcpheal's benchmark machines, 1.3–1.7 nanosleep and 1.5–1.8 of
// the 2.0–2.3 futex calls per request, and about a third of the proxy's CPU
// (bench/FINDINGS.md, "The system monitor's wake-ups").
//
// How: the runtime keeps sysmon awake, sleeping at most 10 ms at a time,
// whenever GODEBUG's schedtrace is set, and reads GODEBUG only at start.
// [Reexec] therefore replaces the process with itself (same PID, arguments
// and environment, and the same executable path, so the same name in ps)
// with GODEBUG schedtrace=2147483647 added, and MCPHEAL_SYSMON_REEXEC=1 so
// that the new image never execs again. The price is sysmon's own 10 ms
// tick while the process is idle, and two things schedtrace asks the
// runtime to print on standard error: a one-line scheduler summary
// ("SCHED …") once per period, 2147483647 ms (24.9 days) of the host's
// monotonic clock, so at every start on a host up longer than that and
// every 24.9 days after; and, on a fatal panic or throw, a dump of every P,
// M and G before the usual panic output (runtime/panic.go, startpanic_m).
//
// An operator who sets schedtrace in GODEBUG (schedtrace=0 turns this
// off) keeps that setting: [Env] adds nothing then.
//
// Only a process about to serve calls [Reexec]: it starts the program again
// from main, so a short-lived command (healthcheck, doctor) must not.
package sysmon
