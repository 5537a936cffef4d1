//go:build !amd64 && !arm64

package prefetch

import "sync/atomic"

// Write loads *p, so that the line is in cache when it is written: the
// nearest a portable program comes to asking for it.
func Write(p *uint64) { atomic.LoadUint64(p) }
