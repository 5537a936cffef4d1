//go:build race

package pages

// raceEnabled: the race detector shadows the heap, and writing it faults
// in the shadow's pages too, so faults are only counted without it.
const raceEnabled = true
