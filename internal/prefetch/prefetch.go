// Package prefetch asks the processor for a cache line a caller is about
// to write, ahead of the write.
//
// A compare-and-swap on a line that is not in the core's cache waits for
// the line, and on x86 it is ordered with every load and store around it,
// so a loop of swaps on random lines pays a memory latency each. A load
// issued early overlaps those latencies, but it may bring the line in
// shared: the swap then asks for it again, to own it, and waits again.
// Write asks for the line to own (PREFETCHW on amd64, PRFM PSTL1KEEP on
// arm64), so a swap issued after it finds the line ready to write.
package prefetch
