//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

// lockState does not lock here: the platform has no flock
// (statelock_flock.go). Give each service a -state directory of its own.
func lockState(string) (func(), error) { return func() {}, nil }
