// Package ctxwait waits on a clock and a context together: a back-off or
// a retry that must not outlive its caller. It is shared by the ingest
// subscriber and the cluster.
package ctxwait

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, and reports false if ctx ended.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
