package streams

import "github.com/google/uuid"

// newEventID returns the event id given to a record appended without one: a UUIDv7
// (RFC 9562) in its text form. Its leading 48 bits are the Unix time in milliseconds,
// so ids made one after another sort one after another, and each append lands on the
// right-hand leaf of its stream's range of the unique (stream_name, event_id) index,
// as a serial key does, where a random UUIDv4 landed on a random leaf: fewer pages
// touched, and fewer full-page images in the WAL after each checkpoint
// (bench/RESULTS.md, issue 21 §2). The other 74 bits are random (google/uuid keeps
// ids from one process increasing within a millisecond), so ids stay unique across
// processes and remain the idempotence key (L4).
func newEventID() string {
	// NewV7 fails only when the random source does, as uuid.NewString would panic then.
	return uuid.Must(uuid.NewV7()).String()
}
