//go:build amd64 || arm64

package prefetch

// Write asks for the cache line holding *p, to be written soon. It never
// faults: p must point into memory the caller holds, but the line need
// not be loaded.
//
//go:noescape
func Write(p *uint64)
