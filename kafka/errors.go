package kafka

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

// errorCode maps a library error onto the Kafka error code a client understands.
// Errors not listed are UNKNOWN_SERVER_ERROR (the client may retry).
func errorCode(err error) int16 {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, streams.ErrStreamNotFound), errors.Is(err, streams.ErrPartitionNotFound):
		return kerr.UnknownTopicOrPartition.Code
	case errors.Is(err, streams.ErrInvalidName):
		return kerr.InvalidTopicException.Code
	case errors.Is(err, streams.ErrPayloadTooLarge):
		return kerr.MessageTooLarge.Code
	case errors.Is(err, streams.ErrInvalidJSON):
		return kerr.InvalidRecord.Code
	case errors.Is(err, streams.ErrOffsetOutOfRange):
		return kerr.OffsetOutOfRange.Code
	case errors.Is(err, streams.ErrPartitionsDecrease):
		return kerr.InvalidPartitions.Code
	case errors.Is(err, streams.ErrInvalidArgument):
		return kerr.InvalidRequest.Code
	case errors.Is(err, consumergroup.ErrUnknownMember):
		return kerr.UnknownMemberID.Code
	case errors.Is(err, consumergroup.ErrIllegalGeneration):
		return kerr.IllegalGeneration.Code
	case errors.Is(err, consumergroup.ErrRebalanceInProgress):
		return kerr.RebalanceInProgress.Code
	case errors.Is(err, consumergroup.ErrInconsistentGroupProtocol):
		return kerr.InconsistentGroupProtocol.Code
	case errors.Is(err, consumergroup.ErrInstanceFenced):
		return kerr.FencedInstanceID.Code
	case errors.Is(err, consumergroup.ErrFenced):
		return kerr.FencedMemberEpoch.Code
	case errors.Is(err, consumergroup.ErrStaleMemberEpoch):
		return kerr.StaleMemberEpoch.Code
	case errors.Is(err, consumergroup.ErrInvalidGroupID):
		return kerr.InvalidGroupID.Code
	case errors.Is(err, consumergroup.ErrGroupNotFound):
		return kerr.GroupIDNotFound.Code
	case errors.Is(err, consumergroup.ErrGroupNotEmpty):
		return kerr.NonEmptyGroup.Code
	case errors.Is(err, consumergroup.ErrGroupSubscribed):
		return kerr.GroupSubscribedToTopic.Code
	case errors.Is(err, consumergroup.ErrOffsetMetadataTooLarge):
		return kerr.OffsetMetadataTooLarge.Code
	case errors.Is(err, consumergroup.ErrInvalidArgument):
		return kerr.InvalidRequest.Code
	case errors.Is(err, errInvalidConfig), errors.Is(err, streamconfig.ErrInvalidConfig):
		return kerr.InvalidConfig.Code
	case errors.Is(err, context.DeadlineExceeded):
		return kerr.RequestTimedOut.Code
	default:
		return kerr.UnknownServerError.Code
	}
}
