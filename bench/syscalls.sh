#!/usr/bin/env bash
# Every system call per request of one relay, by name, under vegeta
# at a fixed rate, on the harness's session and targets (mcpbench targets):
# each request an echo tools/call, known read-only, with an id no other
# request of the run carries. Counted with perf stat's syscall tracepoints
# (COUNTER=perf, the default where perf can read them: the relay runs at full
# speed, and context switches and task-clock CPU per request come with the
# counts) or strace -c -f (COUNTER=strace: strace slows every call, and so
# changes the timing that the Go scheduler's own calls depend on; its counts
# of futex and nanosleep are not those of an untraced run).
#
#   bench/syscalls.sh [json|sse] [mcpheal|passthrough|nginx] [rate] [seconds, e.g. 8s]
#
# mcpheal is `mcpbench proxy`; passthrough is the bare fasthttp relay
# (MCPBENCH_PROXY=passthrough); nginx runs the harness's config (mcpbench
# nginx-conf).
# Needs perf (Debian's linux-perf) or strace, and nginx for that relay;
# everything listens on loopback and stops at the end. STRACE_ARGS replaces
# strace's -c (e.g. "-tt -e trace=close"); KEEP=<dir> keeps vegeta's results,
# the relay's log and the counter's output. mcpheal and the bare relay run
# with the image's environment (the Dockerfile's ENV: mcpbench image-env),
# then RELAY_ENV="GOMAXPROCS=1 ...", whose values win (RELAY_ENV=GODEBUG=:
# Go's default scheduler, as the bare binary runs, its sysmon sleeping as
# usual; docs/performance.md "Performance").
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
mode=${1:-json} relay=${2:-mcpheal} rate=${3:-1000} dur=${4:-8s}
if [ -z "${COUNTER:-}" ]; then
	COUNTER=strace
	perf stat -e raw_syscalls:sys_enter -o /dev/null true 2>/dev/null && COUNTER=perf
fi
case "$COUNTER" in
perf) command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 2; } ;;
strace) command -v strace >/dev/null || { echo "strace is not installed" >&2; exit 2; } ;;
*) echo "COUNTER: perf or strace" >&2; exit 2 ;;
esac

w=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$w"
}
trap cleanup EXIT
go build -o "$w/mcpbench" ./bench/cmd/mcpbench
(cd bench/tools && go build -o "$w/vegeta" github.com/tsenart/vegeta/v12)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up=$(free_port) listen=$(free_port) stats=$(free_port)
"$w/mcpbench" upstream -listen "127.0.0.1:$up" -mode "$mode" >"$w/up.log" 2>&1 &
pids+=($!)
# ready waits (10 s at most) for a mcpbench child to print its readiness line.
ready() {
	for _ in $(seq 100); do grep -qx ready "$1" && return 0; sleep 0.1; done
	echo "not ready: $1" >&2; cat "$1" >&2; exit 1
}
ready "$w/up.log"
case "$relay" in
nginx)
	conf=$("$w/mcpbench" nginx-conf -dir "$w/nginx" -upstream "127.0.0.1:$up" -listen "127.0.0.1:$listen")
	nginx=$(command -v nginx || echo /usr/sbin/nginx)
	"$nginx" -p "$w/nginx" -c "$conf" -e "$w/nginx/error.log" >"$w/relay.log" 2>&1 &
	pids+=($!)
	# nginx prints no readiness line: wait until it answers.
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$listen/admin/stats" && break; sleep 0.1; done
	;;
mcpheal | passthrough)
	image_env=$("$w/mcpbench" image-env) # an assignment, so that set -e stops on its failure
	read -r -a env_ <<<"$image_env ${RELAY_ENV:-}"
	[ "$relay" = passthrough ] && env_+=(MCPBENCH_PROXY=passthrough)
	env "${env_[@]}" "$w/mcpbench" proxy -upstream "http://127.0.0.1:$up/mcp" \
		-listen "127.0.0.1:$listen" -stats "127.0.0.1:$stats" >"$w/relay.log" 2>&1 &
	pids+=($!)
	ready "$w/relay.log"
	;;
*) echo "relay: mcpheal, passthrough or nginx" >&2; exit 2 ;;
esac
relay_pid=${pids[-1]}

# The harness's session (initialize, notifications/initialized, tools/list,
# so mcpheal knows the echo tool is read-only) and its targets, each call
# with its own JSON-RPC id.
# One target per request of the warm-up and the run: an id that came round
# again while a stalled call with it was still in flight would be refused by
# the upstream (the Go SDK: 400 "duplicate in-flight request ID").
secs=${dur%s}
[[ "$secs" =~ ^[0-9]+$ ]] || { echo "duration: whole seconds, e.g. 8s" >&2; exit 2; }
"$w/mcpbench" targets -url "http://127.0.0.1:$listen/mcp" -n $((rate * (secs + 2) + 100)) -out "$w/targets.json"
"$w/vegeta" attack -format json -rate "$rate" -duration 2s -targets "$w/targets.json" >/dev/null # warm-up

traced=("$relay_pid")
[ "$relay" = nginx ] && mapfile -t traced < <(pgrep -P "$relay_pid")
if [ "$COUNTER" = perf ]; then
	# Every system call, and by name those a relay here makes.
	ev=task-clock,context-switches,raw_syscalls:sys_enter
	for c in read write recvfrom writev futex nanosleep epoll_pwait epoll_wait sched_yield getsockopt setsockopt \
		accept4 close tgkill getpid madvise mmap; do
		ev+=",syscalls:sys_enter_$c"
	done
	perf stat -x, -e "$ev" -o "$w/counts.out" -p "$(IFS=,; echo "${traced[*]}")" &
else
	strace ${STRACE_ARGS:--c} -f -o "$w/counts.out" $(printf -- '-p %s ' "${traced[@]}") &
fi
counter_pid=$!
sleep 0.5
"$w/vegeta" attack -format json -rate "$rate" -duration "$dur" -targets "$w/targets.json" >"$w/results.bin"
"$w/vegeta" report -type json <"$w/results.bin" >"$w/report.json"

kill -INT "$counter_pid"
wait "$counter_pid" 2>/dev/null || true
if [ -n "${KEEP:-}" ]; then cp "$w/results.bin" "$w/relay.log" "$w/counts.out" "$KEEP/"; fi
python3 - "$mode" "$relay" "$rate" "$w/report.json" "$w/counts.out" "$COUNTER" <<'EOF'
import json, sys
mode, relay, rate, report, counts, counter = sys.argv[1:]
r = json.load(open(report))
n, ok = r["requests"], r["status_codes"].get("200", 0)
calls, extra, total = [], "", 0
if counter == "perf":
    for line in open(counts):
        f = line.strip().split(",")
        if len(f) < 3 or line.startswith("#") or not f[0].replace(".", "").isdigit():
            continue
        v, name = float(f[0]), f[2]
        if name == "task-clock":
            extra += f"; CPU {v * 1e3 / n:.1f} µs per request (task-clock)"
        elif name == "context-switches":
            extra += f"; {v / n:.2f} context switches per request"
        elif name == "raw_syscalls:sys_enter":
            total = v
        else:
            calls.append((v, name.removeprefix("syscalls:sys_enter_")))
    calls.append((total - sum(c for c, _ in calls), "other"))
else:
    for line in open(counts):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls.append((int(f[3]), f[-1]))
    total = sum(c for c, _ in calls)
other = {k: v for k, v in r["status_codes"].items() if k != "200"}
if other:
    print(f"not 200: {other}; errors: {r.get('errors') or []}")
print(f"{mode} {relay} at {rate}/s ({counter}): {n} requests, {ok} answered 200; {total / n:.2f} system calls per request: "
      + ", ".join(f"{name} {c / n:.2f}" for c, name in sorted(calls, reverse=True) if c / n >= 0.005) + extra)
EOF
