//go:build amd64 || arm64

package prefetch

// Write asks for the cache line holding *p, to be written soon. It is a
// hint: it changes nothing and never faults, and the line need not be in
// any cache.
//
//go:noescape
func Write(p *uint64)
