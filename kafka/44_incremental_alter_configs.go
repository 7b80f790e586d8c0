package kafka

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
)

// IncrementalAlterConfigs v0 to v1: SET and DELETE (back to the default) of a
// topic's mapped configs, all of a resource's changes in one transaction.
// APPEND and SUBTRACT (list configs) apply to cleanup.policy only. Broker configs
// are streamd serve's flags: refused. Needs admin on the stream (a broker resource:
// AdminPrincipal, else CLUSTER_AUTHORIZATION_FAILED).
var incrementalAlterConfigsHandler = handler{key: 44, min: 0, max: 1, fn: handleIncrementalAlterConfigs}

func handleIncrementalAlterConfigs(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.IncrementalAlterConfigsRequest)
	resp := req.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
	var topics []string
	for _, res := range req.Resources {
		if res.ResourceType == kmsg.ConfigResourceTypeTopic {
			topics = append(topics, res.ResourceName)
		}
	}
	allowed, err := r.decide(ctx, topics)
	if err != nil {
		return nil, err
	}
	for _, res := range req.Resources {
		rr := kmsg.NewIncrementalAlterConfigsResponseResource()
		rr.ResourceType, rr.ResourceName = res.ResourceType, res.ResourceName
		denied := kerr.TopicAuthorizationFailed.Code
		if res.ResourceType != kmsg.ConfigResourceTypeTopic {
			denied = kerr.ClusterAuthorizationFailed.Code
		}
		if !r.isAdmin() && (res.ResourceType != kmsg.ConfigResourceTypeTopic || !allowed.Allows(res.ResourceName, access.Admin)) {
			rr.ErrorCode = denied
			resp.Resources = append(resp.Resources, rr)
			continue
		}
		if res.ResourceType != kmsg.ConfigResourceTypeTopic {
			rr.ErrorCode = kerr.InvalidRequest.Code
			msg := "streamd alters topic configs only; a broker's settings are streamd serve's flags"
			rr.ErrorMessage = &msg
			resp.Resources = append(resp.Resources, rr)
			continue
		}
		err := pgx.BeginFunc(ctx, r.s.pool, func(tx pgx.Tx) error {
			settings, err := loadTopicSettings(ctx, tx, res.ResourceName, r.s.cfg.Compression)
			if err != nil {
				return err
			}
			for _, c := range res.Configs {
				var err error
				switch c.Op {
				case kmsg.IncrementalAlterConfigOpSet:
					err = settings.set(c.Name, c.Value)
				case kmsg.IncrementalAlterConfigOpDelete:
					err = settings.set(c.Name, nil)
				case kmsg.IncrementalAlterConfigOpAppend, kmsg.IncrementalAlterConfigOpSubtract:
					err = settings.appendSubtract(c.Name, c.Value, c.Op == kmsg.IncrementalAlterConfigOpAppend)
				default:
					err = fmt.Errorf("%w: %s: unknown operation %d", errInvalidConfig, c.Name, c.Op)
				}
				if err != nil {
					return err
				}
			}
			if err := settings.save(ctx, tx, res.ResourceName); err != nil {
				return err
			}
			if req.ValidateOnly {
				return errValidateOnly
			}
			return nil
		})
		if err != nil && err != errValidateOnly {
			rr.ErrorCode = errorCode(err)
			msg := err.Error()
			rr.ErrorMessage = &msg
		}
		r.s.forgetCompression(res.ResourceName)
		resp.Resources = append(resp.Resources, rr)
	}
	return resp, nil
}

// appendSubtract adds value to or removes it from the list config name.
func (t *topicSettings) appendSubtract(name string, value *string, add bool) error {
	if name != cfgCleanupPolicy || value == nil {
		return fmt.Errorf("%w: %s: APPEND and SUBTRACT apply to %s only", errInvalidConfig, name, cfgCleanupPolicy)
	}
	has := map[string]bool{}
	for _, e := range t.entries() {
		if e.name == cfgCleanupPolicy {
			for _, p := range splitList(*e.value) {
				has[p] = true
			}
		}
	}
	for _, p := range splitList(*value) {
		has[p] = add
	}
	var list []string
	for _, p := range []string{"compact", "delete"} {
		if has[p] {
			list = append(list, p)
		}
	}
	if len(list) == 0 {
		return fmt.Errorf("%w: %s: a topic keeps delete or compact or both", errInvalidConfig, name)
	}
	joined := list[0]
	if len(list) == 2 {
		joined = "compact,delete"
	}
	return t.set(name, &joined)
}
