package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/forward"
)

// newForwardCmd is `streamd forward`: drain a stream into RabbitMQ through a consumer
// group, committing offsets only after the broker confirmed (package forward).
func newForwardCmd(g *globals) *cobra.Command {
	var cfg forward.Config
	var stream string
	cmd := &cobra.Command{
		Use:   "forward STREAM --queue Q",
		Short: "Forward a stream to RabbitMQ (AMQP 0.9.1, publisher confirms), at-least-once and in order per partition",
		Long: `forward reads a stream as a member of a consumer group and publishes every event
to RabbitMQ, waiting for the broker's confirms before it commits the group's offsets.
A forwarder that dies resumes from the last committed batch: the broker may receive a
batch twice (the AMQP message id is the event id), never lose one. Run several for
one stream to share its partitions.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requirePositive(cmd, "batch-size", "confirm-timeout", "session-timeout"); err != nil {
				return err
			}
			var err error
			if cfg.Stream, err = streamArg(cmd, args, stream); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if cfg.AMQPURL == "" {
				cfg.AMQPURL = os.Getenv("STREAMD_AMQP_URL")
			}
			pool, err := g.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg.Logger = g.logger
			f, err := forward.New(pool, &cfg)
			if err != nil {
				return err
			}
			return f.Run(ctx)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&stream, "stream", "", "the stream (the argument's former flag)")
	_ = fl.MarkHidden("stream")
	fl.StringVar(&cfg.AMQPURL, "amqp-url", "", "the broker, e.g. amqp://guest:guest@127.0.0.1:5672/ (default $STREAMD_AMQP_URL)")
	fl.StringVar(&cfg.Exchange, "exchange", "", "exchange to publish to (default: the default exchange)")
	fl.StringVar(&cfg.Queue, "queue", "", "durable queue to declare; also the routing key unless --routing-key is given")
	fl.StringVar(&cfg.RoutingKey, "routing-key", "", "routing key (default: --queue)")
	fl.StringVar(&cfg.Group, "group", "", "consumer group (default streamd-forward-<stream>)")
	fl.IntVar(&cfg.MaxBatchSize, "batch-size", 500, "events per confirm round")
	fl.DurationVar(&cfg.ConfirmTimeout, "confirm-timeout", 30*time.Second, "wait for the broker's confirms of a batch")
	fl.DurationVar(&cfg.SessionTimeout, "session-timeout", 30*time.Second, "consumer group session timeout")
	return cmd
}
