//go:build !race

package pages

const raceEnabled = false
