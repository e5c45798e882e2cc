// Package plugintest holds what the plugin tests of several packages
// (the host's, the Python example's) share.
package plugintest
