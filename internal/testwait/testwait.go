// Package testwait waits, in tests, on a condition rather than on luck: it
// polls with a deadline generous enough for a loaded two-core machine.
// Only tests import it (no command links package testing).
package testwait

import (
	"testing"
	"time"
)

// For polls cond every 5 ms until it holds, failing the test after 20 s.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
