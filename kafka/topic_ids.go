package kafka

import (
	"context"
	"crypto/sha256"
)

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

// topicNameOf is the name of the stream whose topic id is id, "" when none has it:
// from the cache resolveTopicIDs keeps, reloaded when id is not in it.
func (s *Server) topicNameOf(ctx context.Context, id [16]byte) (string, error) {
	s.topicIDs.mu.Lock()
	defer s.topicIDs.mu.Unlock()
	if name, ok := s.topicIDs.names[id]; ok {
		return name, nil
	}
	names, err := s.topicNamesByID(ctx)
	if err != nil {
		return "", err
	}
	s.topicIDs.names = names
	return names[id], nil
}
