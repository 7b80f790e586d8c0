package kafka

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/streams"
)

// InitProducerId v0 to v4, for idempotent producers only: a transactional id is
// refused (transactions are not supported). v3+ may bump the epoch of a known
// producer id.
var initProducerIDHandler = handler{key: 22, min: 0, max: 4, fn: handleInitProducerID}

func handleInitProducerID(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.InitProducerIDRequest)
	resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if req.TransactionalID != nil {
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		return resp, nil
	}
	id, epoch, err := r.s.streams.InitProducer(ctx, req.ProducerID, req.ProducerEpoch)
	switch {
	case errors.Is(err, streams.ErrProducerFenced):
		resp.ErrorCode = kerr.ProducerFenced.Code
	case err != nil:
		resp.ErrorCode = errorCode(err)
	default:
		resp.ProducerID, resp.ProducerEpoch = id, epoch
	}
	return resp, nil
}
