//go:build race

package kafka

// raceEnabled: built with -race, whose sync.Pool drops a Put item at random (so a
// pooled scratch is allocated again), which allocation counts must allow for.
const raceEnabled = true
