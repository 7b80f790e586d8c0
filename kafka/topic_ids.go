package kafka

import "crypto/sha256"

// topicID is a topic's id: streams have none, so it is derived from the name (the
// first 16 bytes of a SHA-256), the same on every instance. KIP-848 assignments name
// topics by id, which clients resolve through Metadata. A topic deleted and created
// again keeps its id (Kafka would give it a new one).
func topicID(name string) [16]byte {
	sum := sha256.Sum256([]byte("streamd topic\x00" + name))
	var id [16]byte
	copy(id[:], sum[:16])
	return id
}
