package kafka

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/brokers"
)

// consumerOffsetsTopic is Kafka's internal topic of committed offsets. streamd keeps
// committed offsets as rows (streamd.consumer_offsets: OffsetCommit, OffsetFetch,
// `streamd groups describe`), not as records, but Metadata lists the topic, marked
// internal, with one empty partition: clients skip internal topics in regex
// subscriptions and some tools look for it. Produce to it is refused with
// INVALID_TOPIC_EXCEPTION, as Kafka refuses a client's produce to an internal topic;
// Fetch and ListOffsets find it empty (offset 0). It is shown to every principal (it
// holds nothing). A stream of that name, made through another door, is not served
// over Kafka: the internal topic takes its name.
const consumerOffsetsTopic = "__consumer_offsets"

// internalTopicMetadata is the internal topic's Metadata: one partition, led like
// any other.
func internalTopicMetadata(live []brokers.Broker) kmsg.MetadataResponseTopic {
	mt := topicMetadata(live, consumerOffsetsTopic, 1)
	mt.IsInternal = true
	return mt
}

// fetchInternal answers a Fetch of the internal topic's partition: empty, its log
// start and end 0.
func fetchInternal(rp *kmsg.FetchResponseTopicPartition, p kmsg.FetchRequestTopicPartition) {
	switch {
	case p.Partition != 0:
		rp.ErrorCode = kerr.UnknownTopicOrPartition.Code
	case p.FetchOffset != 0:
		rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = 0, 0, 0
		rp.ErrorCode = kerr.OffsetOutOfRange.Code
	default:
		rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = 0, 0, 0
	}
}

// listInternalOffset answers ListOffsets for the internal topic's partition: every
// offset is 0; a time finds no record (-1, as Kafka answers).
func listInternalOffset(rp *kmsg.ListOffsetsResponseTopicPartition, ts int64) {
	switch {
	case rp.Partition != 0:
		rp.ErrorCode = kerr.UnknownTopicOrPartition.Code
	case ts < 0:
		rp.Offset = 0
	}
}
