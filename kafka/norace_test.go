//go:build !race

package kafka

// raceEnabled: built without -race (race_test.go).
const raceEnabled = false
