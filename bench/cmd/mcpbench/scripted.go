package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

// runNginxConf is the "nginx-conf" subcommand: it writes the harness's
// nginx configuration (nginxConf) into -dir and prints its path, so that a
// script measures the same nginx as the harness.
func runNginxConf(args []string) error {
	fs := flag.NewFlagSet("nginx-conf", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory for nginx.conf, its pid, logs and temp paths")
	upstream := fs.String("upstream", "", "upstream host:port")
	listen := fs.String("listen", "", "address nginx listens on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *upstream == "" || *listen == "" {
		return errors.New("nginx-conf: -dir, -upstream and -listen are required")
	}
	conf, err := writeNginxConf(*dir, *upstream, *listen)
	if err == nil {
		fmt.Println(conf)
	}
	return err
}

// runTargets is the "targets" subcommand: it opens a session on -url as the
// harness does (bench.Initialize: initialize, notifications/initialized,
// tools/list) and writes -n vegeta JSON targets on it with unique ids
// (writeTargets) to -out.
func runTargets(args []string) error {
	fs := flag.NewFlagSet("targets", flag.ContinueOnError)
	url := fs.String("url", "", "MCP endpoint to open the session on")
	n := fs.Int("n", 1024, "targets to write (vegeta cycles through them)")
	out := fs.String("out", "", "targets file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *out == "" || *n <= 0 {
		return errors.New("targets: -url, -out and a positive -n are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := bench.Initialize(ctx, &http.Client{}, *url, true)
	if err != nil {
		return err
	}
	return writeTargets(*out, s, 1, *n)
}
