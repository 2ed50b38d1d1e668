package proxy

import "github.com/mcpheal/mcpheal/proxy/internal/conf"

// Config configures a Server (or each upstream of a Router). Zero values
// take the documented defaults; every field is documented at its
// definition, proxy/internal/conf.
type Config = conf.Config

// AdminFor returns the admin listener's address for an agent listener that
// sets none (conf.AdminFor).
func AdminFor(listen string) string { return conf.AdminFor(listen) }

// Defaults returns the values the zero fields of a Config take
// (conf.Defaults).
func Defaults() Config { return conf.Defaults() }

// IsLoopback reports whether a listen address only takes local
// connections (conf.IsLoopback).
func IsLoopback(listen string) bool { return conf.IsLoopback(listen) }
