// Package conf is the configuration of one upstream (Config), its
// documented defaults (normalize, Defaults) and the settings' small
// helpers. It is the bottom of proxy's stages (proxy/doc.go): it imports
// none of them, and holds no state but the configuration.
package conf
