package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var apiVersionsHandler = handler{key: 18, min: 0, max: 4, fn: handleAPIVersions}

var unsupportedVersion = kerr.UnsupportedVersion.Code

func handleAPIVersions(_ context.Context, r *request) (kmsg.Response, error) {
	return r.s.apiVersionsResponse(r.version, 0), nil
}

// apiVersionsResponse lists every API of the handler table with its version range.
func (s *Server) apiVersionsResponse(version, errCode int16) *kmsg.ApiVersionsResponse {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(version)
	resp.ErrorCode = errCode
	for _, h := range s.sortedHandlers() {
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = h.key, h.min, h.max
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	return resp
}
