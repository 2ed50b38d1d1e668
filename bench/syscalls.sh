#!/usr/bin/env bash
# Every system call per request of one relay, by name (issue 16): strace -c -f
# on the relay process under vegeta at a fixed rate, each request a
# tools/call with its own id on one session. strace slows every call, so
# the figures are counts, not costs.
#
#   bench/syscalls.sh [json|sse] [mcpheal|passthrough|nginx] [rate] [duration]
#
# mcpheal is `mcpbench proxy`; passthrough is the bare fasthttp relay
# (MCPBENCH_PROXY=passthrough); nginx is the harness's keepalive config.
# Needs strace (and nginx for that relay); everything listens on loopback
# and stops at the end. STRACE_ARGS replaces -c (e.g. "-tt -e trace=close");
# KEEP=<dir> keeps vegeta's results, the relay's log and strace's output;
# RELAY_ENV="GOMAXPROCS=1 ..." is added to mcpheal's or the bare relay's
# environment only.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
mode=${1:-json} relay=${2:-mcpheal} rate=${3:-1000} dur=${4:-8s}
command -v strace >/dev/null || { echo "strace is not installed" >&2; exit 2; }

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
case "$relay" in
nginx)
	mkdir -p "$w/nginx/tmp"
	cat >"$w/nginx/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 2;
pid $w/nginx/nginx.pid;
error_log $w/nginx/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $w/nginx/tmp;
    proxy_temp_path $w/nginx/tmp;
    upstream mcp { server 127.0.0.1:$up; keepalive 128; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$listen;
        location / {
            proxy_pass http://mcp;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host 127.0.0.1:$up;
            proxy_buffering off;
            proxy_request_buffering off;
        }
    }
}
EOF
	nginx=$(command -v nginx || echo /usr/sbin/nginx)
	"$nginx" -c "$w/nginx/nginx.conf" -p "$w/nginx" >"$w/relay.log" 2>&1 &
	pids+=($!)
	;;
mcpheal | passthrough)
	read -r -a env_ <<<"${RELAY_ENV:-}"
	[ "$relay" = passthrough ] && env_+=(MCPBENCH_PROXY=passthrough)
	env "${env_[@]}" "$w/mcpbench" proxy -upstream "http://127.0.0.1:$up/mcp" \
		-listen "127.0.0.1:$listen" -stats "127.0.0.1:$stats" >"$w/relay.log" 2>&1 &
	pids+=($!)
	;;
*) echo "relay: mcpheal, passthrough or nginx" >&2; exit 2 ;;
esac
relay_pid=${pids[-1]}
url="http://127.0.0.1:$listen/mcp"
for _ in $(seq 50); do curl -s -o /dev/null "$url" && break; sleep 0.1; done

# One session; vegeta's targets each carry their own JSON-RPC id (an id
# reused while in flight is refused by the Go SDK server).
hdr=(-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream')
sid=$(curl -s -D - -o /dev/null "${hdr[@]}" -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"syscalls","version":"1"}}}' "$url" |
	awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}' | tr -d '\r')
[ -n "$sid" ] || { echo "no session through $relay" >&2; cat "$w/relay.log" >&2; exit 1; }
curl -s -o /dev/null "${hdr[@]}" -H 'MCP-Protocol-Version: 2025-06-18' -H "Mcp-Session-Id: $sid" \
	-d '{"jsonrpc":"2.0","method":"notifications/initialized"}' "$url"
mkdir -p "$w/bodies"
for i in $(seq 1 1024); do
	printf '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}' "$i" >"$w/bodies/$i.json"
	printf 'POST %s\nContent-Type: application/json\nAccept: application/json, text/event-stream\nMCP-Protocol-Version: 2025-06-18\nMcp-Session-Id: %s\n@%s\n\n' \
		"$url" "$sid" "$w/bodies/$i.json"
done >"$w/targets.txt"
"$w/vegeta" attack -rate "$rate" -duration 2s -targets "$w/targets.txt" >/dev/null # warm-up

traced=("$relay_pid")
[ "$relay" = nginx ] && mapfile -t traced < <(pgrep -P "$relay_pid")
strace ${STRACE_ARGS:--c} -f -o "$w/strace.out" $(printf -- '-p %s ' "${traced[@]}") &
strace_pid=$!
sleep 0.5
"$w/vegeta" attack -rate "$rate" -duration "$dur" -targets "$w/targets.txt" >"$w/results.bin"
"$w/vegeta" report -type json <"$w/results.bin" >"$w/report.json"

kill -INT "$strace_pid"
wait "$strace_pid" 2>/dev/null || true
if [ -n "${KEEP:-}" ]; then cp "$w/results.bin" "$w/relay.log" "$w/strace.out" "$KEEP/"; fi
python3 - "$mode" "$relay" "$rate" "$w/report.json" "$w/strace.out" <<'EOF'
import json, sys
mode, relay, rate, report, trace = sys.argv[1:]
r = json.load(open(report))
n, ok = r["requests"], r["status_codes"].get("200", 0)
calls = []
for line in open(trace):
    f = line.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
        calls.append((int(f[3]), f[-1]))
total = sum(c for c, _ in calls)
other = {k: v for k, v in r["status_codes"].items() if k != "200"}
if other:
    print(f"not 200: {other}; errors: {r.get('errors') or []}")
print(f"{mode} {relay} at {rate}/s: {n} requests, {ok} answered 200; {total / n:.2f} system calls per request: "
      + ", ".join(f"{name} {c / n:.2f}" for c, name in sorted(calls, reverse=True) if c / n >= 0.005))
EOF
