package kafka

import (
	"context"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// handler serves one API key over a range of versions. Each API family's file
// declares one (var xxxHandler = handler{...}); the table below lists them.
type handler struct {
	key      int16
	min, max int16
	// fn answers one request, decoded at a version within [min, max]. A nil response
	// with a nil error sends nothing (Produce with acks=0). An error closes the
	// connection (after it is logged); answer protocol errors with the response's
	// error codes instead.
	fn func(ctx context.Context, r *request) (kmsg.Response, error)
}

// handlers is the dispatch table: adding an API is one file and one line here.
// ApiVersions answers from it.
var handlers = []*handler{
	&produceHandler,
	&fetchHandler,
	&listOffsetsHandler,
	&metadataHandler,
	&offsetCommitHandler,
	&offsetFetchHandler,
	&findCoordinatorHandler,
	&joinGroupHandler,
	&heartbeatHandler,
	&leaveGroupHandler,
	&syncGroupHandler,
	&describeGroupsHandler,
	&listGroupsHandler,
	&apiVersionsHandler,
	&createTopicsHandler,
	&deleteTopicsHandler,
	&deleteRecordsHandler,
	&initProducerIDHandler,
	&describeACLsHandler,
	&createACLsHandler,
	&deleteACLsHandler,
	&describeConfigsHandler,
	&createPartitionsHandler,
	&deleteGroupsHandler,
	&incrementalAlterConfigsHandler,
	&offsetDeleteHandler,
	&describeClusterHandler,
	&consumerGroupHeartbeatHandler,
	&consumerGroupDescribeHandler,
}

// saslHandlers join the table when the server authenticates clients (Config.Tokens).
var saslHandlers = []*handler{&saslHandshakeHandler, &saslAuthenticateHandler}

// servedBeforeAuthentication: the APIs a client may call before SASL authenticated it.
func servedBeforeAuthentication(key int16) bool {
	return key == apiVersionsHandler.key || key == saslHandshakeHandler.key || key == saslAuthenticateHandler.key
}

// handlerTable indexes handlers (and saslHandlers when sasl) by key, checking that
// no key appears twice and that kmsg can decode every version advertised.
func handlerTable(sasl bool) map[int16]*handler {
	all := handlers
	if sasl {
		all = append(slices.Clip(handlers), saslHandlers...)
	}
	t := make(map[int16]*handler, len(all))
	for _, h := range all {
		if _, dup := t[h.key]; dup {
			panic("kafka: two handlers for key " + kmsg.NameForKey(h.key))
		}
		kreq := kmsg.RequestForKey(h.key)
		if kreq == nil || h.min < 0 || h.min > h.max || h.max > kreq.MaxVersion() {
			panic("kafka: handler for " + kmsg.NameForKey(h.key) + " has a version range kmsg cannot decode")
		}
		t[h.key] = h
	}
	return t
}

// sortedHandlers is the table by key, for ApiVersions.
func (s *Server) sortedHandlers() []*handler {
	out := make([]*handler, 0, len(s.table))
	for _, h := range s.table {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b *handler) int { return int(a.key) - int(b.key) })
	return out
}

// request is one decoded request and where it came from.
type request struct {
	s        *Server
	c        *conn
	key      int16
	version  int16
	corr     int32
	clientID string
	kreq     kmsg.Request
}
