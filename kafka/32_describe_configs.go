package kafka

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
)

// DescribeConfigs v0 to v4: a topic's mapped configs (configs.go; read on the
// stream needed); a broker has none to show (its settings are streamd serve's flags;
// AdminPrincipal only).
var describeConfigsHandler = handler{key: 32, min: 0, max: 4, fn: handleDescribeConfigs}

func handleDescribeConfigs(ctx context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.DescribeConfigsRequest)
	resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
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
		rr := kmsg.NewDescribeConfigsResponseResource()
		rr.ResourceType, rr.ResourceName = res.ResourceType, res.ResourceName
		switch res.ResourceType {
		case kmsg.ConfigResourceTypeBroker, kmsg.ConfigResourceTypeBrokerLogger:
			if !r.isAdmin() {
				rr.ErrorCode = kerr.ClusterAuthorizationFailed.Code
			}
		case kmsg.ConfigResourceTypeTopic:
			if !allowed.Allows(res.ResourceName, access.Read) {
				rr.ErrorCode = kerr.TopicAuthorizationFailed.Code
				break
			}
			var settings *topicSettings
			err := pgx.BeginFunc(ctx, r.s.pool, func(tx pgx.Tx) error {
				var err error
				settings, err = loadTopicSettings(ctx, tx, res.ResourceName, r.s.cfg.Compression)
				return err
			})
			if err != nil {
				rr.ErrorCode = errorCode(err)
				msg := err.Error()
				rr.ErrorMessage = &msg
				break
			}
			for _, e := range settings.entries() {
				if res.ConfigNames != nil && !slices.Contains(res.ConfigNames, e.name) {
					continue
				}
				c := kmsg.NewDescribeConfigsResponseResourceConfig()
				c.Name, c.Value, c.ReadOnly, c.IsDefault, c.ConfigType = e.name, e.value, e.readOnly, e.isDefault, e.typ
				c.Source = kmsg.ConfigSourceDynamicTopicConfig
				if e.isDefault {
					c.Source = kmsg.ConfigSourceDefaultConfig
				}
				rr.Configs = append(rr.Configs, c)
			}
		default:
			rr.ErrorCode = kerr.InvalidRequest.Code
			msg := "streamd describes topic and broker configs only"
			rr.ErrorMessage = &msg
		}
		resp.Resources = append(resp.Resources, rr)
	}
	return resp, nil
}
