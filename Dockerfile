# mcpheal container image: a static binary on distroless, running as non-root.
#
#   docker build -t mcpheal .
#   docker run --rm -p 127.0.0.1:8787:8787 -e WP_TOKEN -e MCPHEAL_TOKEN \
#     -v "$PWD/mcpheal.yaml:/etc/mcpheal/mcpheal.yaml:ro" mcpheal
#
# The config is read from /etc/mcpheal/mcpheal.yaml: mount yours there (see
# config.example.yaml; `mcpheal --check-config FILE` validates it). Inside the
# container mcpheal must listen on 0.0.0.0 for the published port to reach it,
# so the command below passes --listen 0.0.0.0:8787 (overriding the file), and
# mcpheal refuses to start on a non-loopback address unless agents must
# authenticate: put `auth_tokens: ["${MCPHEAL_TOKEN}"]` in the file (agents
# then send Authorization: Bearer <token>, and the upstream's credential comes
# from the file's headers or credentials), or, when only trusted local
# processes can reach the published port, `insecure_listen: true`.
#
# Without a config file, for one upstream:
#
#   docker run --rm -p 127.0.0.1:8787:8787 mcpheal \
#     --listen 0.0.0.0:8787 --insecure-listen --upstream https://mcp.example.com/mcp
#
# Agents in other containers reach it by a name (http://mcpheal:8787/mcp): add
# that name to allow_hosts (or --allow-host mcpheal), or the DNS-rebinding
# guard answers 403. In a Kubernetes pod the sidecar listens on 127.0.0.1 and
# needs none of this (examples/kubernetes/sidecar.yaml).

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# CGO_ENABLED=0: a static binary that runs on distroless/static (no libc).
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/mcpheal . \
 && mkdir -p /out/etc/mcpheal

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/mcpheal /mcpheal
COPY --from=build --chown=65532:65532 /out/etc/mcpheal /etc/mcpheal
USER 65532:65532
# Keeps the Go runtime's sysmon awake (never parked), which cut mcpheal's CPU
# per request by 26-30 % at 2000 req/s in its benchmark (README "Performance").
# Side effects on standard error: a one-line SCHED summary every 2147483647 ms
# (24.9 days) of the host's monotonic clock, and a scheduler dump before a
# fatal panic's output. `docker run -e GODEBUG=...` replaces this value: keep
# schedtrace=2147483647 in yours.
ENV GODEBUG=schedtrace=2147483647
EXPOSE 8787
# /healthz answers 200 while the process serves. distroless has no curl:
# the binary checks itself.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/mcpheal", "healthcheck", "http://127.0.0.1:8787/healthz"]
ENTRYPOINT ["/mcpheal"]
CMD ["--config", "/etc/mcpheal/mcpheal.yaml", "--listen", "0.0.0.0:8787"]
