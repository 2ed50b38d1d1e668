package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// nginxConf is a plain reverse proxy as the issue asks: keepalive upstream
// connections, no buffering in either direction, Host rewritten to the
// upstream's. Two workers match the two cores mcpheal's GOMAXPROCS uses.
// keepalive_requests is raised from its default of 1000 so that nginx does
// not close a client connection vegeta is about to reuse (a POST on it then
// fails with EOF, which the other targets never cause).
const nginxConf = `daemon off;
master_process on;
worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path %[1]s/tmp/body;
    proxy_temp_path %[1]s/tmp/proxy;
    fastcgi_temp_path %[1]s/tmp/fastcgi;
    uwsgi_temp_path %[1]s/tmp/uwsgi;
    scgi_temp_path %[1]s/tmp/scgi;
    upstream mcp {
        server %[2]s;
        keepalive 128;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }
    server {
        listen %[3]s;
        location / {
            proxy_pass http://mcp;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host %[2]s;
            proxy_buffering off;%[4]s
            proxy_request_buffering off;
            proxy_read_timeout 60s;
        }
    }
}
`

// nginxBufferKB, from -nginx-buffer-kb, sets proxy_buffer_size (and
// proxy_buffers to match) when positive. With proxy_buffering off nginx
// passes on each read of that one buffer as it arrives, and its default is
// one memory page: a large answer then costs nginx (and its client) a write
// per page. 0 keeps nginx's defaults, the configuration measured by default.
var nginxBufferKB int

// nginxBufferConf returns the directives -nginx-buffer-kb adds.
func nginxBufferConf() string {
	if nginxBufferKB <= 0 {
		return ""
	}
	return fmt.Sprintf("\n            proxy_buffer_size %[1]dk;\n            proxy_buffers 4 %[1]dk;\n            proxy_busy_buffers_size %[2]dk;",
		nginxBufferKB, 2*nginxBufferKB)
}

// findNginx returns the nginx binary, or "" when none is installed.
func findNginx() string {
	for _, p := range []string{"nginx", "/usr/sbin/nginx"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	return ""
}

// nginxProc is a running nginx: the master and its workers.
type nginxProc struct {
	master *child
	pids   []int // master and workers, for CPU and memory
}

// writeNginxConf writes nginxConf for upstream (host:port) and listen into
// dir, with the temp paths it names, and returns the file's path.
func writeNginxConf(dir, upstream, listen string) (string, error) {
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o777); err != nil {
		return "", err
	}
	// Workers run as an unprivileged user and may need the temp paths.
	_ = os.Chmod(dir, 0o755)
	_ = os.Chmod(filepath.Join(dir, "tmp"), 0o777)
	conf := filepath.Join(dir, "nginx.conf")
	return conf, os.WriteFile(conf, fmt.Appendf(nil, nginxConf, dir, upstream, listen, nginxBufferConf()), 0o644)
}

// startNginx runs nginx in front of upstream (host:port) on listen.
func startNginx(ctx context.Context, bin, dir, upstream, listen string) (*nginxProc, error) {
	conf, err := writeNginxConf(dir, upstream, listen)
	if err != nil {
		return nil, err
	}
	m, err := startChild(ctx, "nginx", filepath.Join(dir, "stderr.log"), false, nil, bin, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"))
	if err != nil {
		return nil, err
	}
	n := &nginxProc{master: m}
	if err := n.waitServing(ctx, "http://"+listen+"/admin/stats"); err != nil {
		m.kill()
		return nil, fmt.Errorf("nginx (see %s): %w", filepath.Join(dir, "error.log"), err)
	}
	return n, nil
}

// nginxWorkers is worker_processes in nginxConf.
const nginxWorkers = 2

// waitServing polls url until nginx answers it 200 (nginx prints no
// readiness line, so a served request is the signal) and all workers are
// forked. Bounded by 10 s.
func (n *nginxProc) waitServing(ctx context.Context, url string) error {
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	hc := &http.Client{Timeout: time.Second}
	for {
		if resp, err := hc.Get(url); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			workers, _ := childPids(n.master.pid())
			if resp.StatusCode == http.StatusOK && len(workers) == nginxWorkers {
				n.pids = append([]int{n.master.pid()}, workers...)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not served by %d workers after 10 s", url, nginxWorkers)
		}
		select {
		case <-n.master.done:
			return errors.New("exited before serving")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// stop ends nginx (SIGTERM: fast shutdown of master and workers).
func (n *nginxProc) stop() { n.master.stop(5 * time.Second) }
