//go:build !race

package shardpool_test

const raceEnabled = false
