package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/brokers"
	"github.com/streamd/streamd/kafka"
	"github.com/streamd/streamd/wakeup"
)

// kafkaConfig is streamd serve's Kafka front door (kafka.Server), off unless
// --kafka-addr is set. It shares the API's principals (--auth-token,
// --auth-token-file: clients authenticate with SASL) and certificate (--tls-cert,
// --tls-key: the listener speaks TLS).
type kafkaConfig struct {
	addr           string
	advertisedAddr string
	autoCreate     bool
	// brokerIdentities: the node ids this instance is in Metadata (kafka.Config.BrokerIdentities).
	brokerIdentities int64
	// compression: the fetch codec of topics whose performance_config says nothing.
	compression string
	// producerExpiration: the leader forgets idempotent producers idle this long
	// (streams.Client.ExpireProducers), whether or not this instance serves Kafka.
	producerExpiration time.Duration
	// oauthUnsecured: OAUTHBEARER also accepts unsecured JWTs (development), with
	// oauthRequiredScope (space or comma separated) and oauthClockSkew
	// (kafka.OAuthBearerUnsecured).
	oauthUnsecured     bool
	oauthRequiredScope string
	oauthClockSkew     time.Duration
}

func (c *serveConfig) kafkaFlags(f *pflag.FlagSet) {
	f.StringVar(&c.kafka.addr, "kafka-addr", envOr("STREAMD_KAFKA_ADDR", ""), "serve the Kafka protocol on this address, e.g. 127.0.0.1:9092 (off when empty). Clients authenticate with SASL (PLAIN, SCRAM-SHA-256/512: the principal and one of its API tokens) and speak TLS with --tls-cert; with --auth-disabled, loopback only ($STREAMD_KAFKA_ADDR)")
	f.StringVar(&c.kafka.advertisedAddr, "kafka-advertised-addr", envOr("STREAMD_KAFKA_ADVERTISED_ADDR", ""), "host:port Kafka clients are told to connect to (default: the listener's address) ($STREAMD_KAFKA_ADVERTISED_ADDR)")
	f.DurationVar(&c.kafka.producerExpiration, "producer-id-expiration", c.envDuration("producer-id-expiration", "STREAMD_PRODUCER_ID_EXPIRATION", 24*time.Hour), "the leader forgets an idempotent (Kafka) producer's sequences on a partition it appended nothing to for this long, as Kafka's producer.id.expiration.ms ($STREAMD_PRODUCER_ID_EXPIRATION)")
	f.Int64Var(&c.kafka.brokerIdentities, "kafka-broker-identities", c.envInt64("kafka-broker-identities", "STREAMD_KAFKA_BROKER_IDENTITIES", 1), "how many brokers (node ids, 1 to 64) this instance is in Metadata, all at its address, partition leadership spread over them: a client keeps one fetch in flight per broker. Above 1 only for clients that key brokers by node id (franz-go); librdkafka 2.0.2 (kcat) never fetches ($STREAMD_KAFKA_BROKER_IDENTITIES)")
	f.StringVar(&c.kafka.compression, "kafka-compression", envOr("STREAMD_KAFKA_COMPRESSION", "uncompressed"), "the compression.type of topics that set none: Fetch batches compressed with uncompressed, gzip, snappy, lz4 or zstd, as Kafka's broker-level compression.type ($STREAMD_KAFKA_COMPRESSION)")
	f.BoolVar(&c.kafka.oauthUnsecured, "kafka-sasl-oauthbearer-unsecured", c.envBool("kafka-sasl-oauthbearer-unsecured", "STREAMD_KAFKA_SASL_OAUTHBEARER_UNSECURED", false), "for development only: SASL OAUTHBEARER also accepts unsecured JWTs (alg none, unsigned) whose sub claim is the principal, as Kafka's default OAUTHBEARER handler does; anyone can then claim any principal, so it needs a loopback --kafka-addr and an --auth-token ($STREAMD_KAFKA_SASL_OAUTHBEARER_UNSECURED)")
	f.StringVar(&c.kafka.oauthRequiredScope, "kafka-sasl-oauthbearer-unsecured-required-scope", envOr("STREAMD_KAFKA_SASL_OAUTHBEARER_UNSECURED_REQUIRED_SCOPE", ""), "the scopes (space or comma separated) an unsecured JWT's scope claim must hold, as Kafka's unsecuredValidatorRequiredScope ($STREAMD_KAFKA_SASL_OAUTHBEARER_UNSECURED_REQUIRED_SCOPE)")
	f.DurationVar(&c.kafka.oauthClockSkew, "kafka-sasl-oauthbearer-unsecured-clock-skew", c.envDuration("kafka-sasl-oauthbearer-unsecured-clock-skew", "STREAMD_KAFKA_SASL_OAUTHBEARER_UNSECURED_CLOCK_SKEW", 0), "the clock skew allowed on an unsecured JWT's exp and iat, as Kafka's unsecuredValidatorAllowableClockSkewMs ($STREAMD_KAFKA_SASL_OAUTHBEARER_UNSECURED_CLOCK_SKEW)")
	f.BoolVar(&c.kafka.autoCreate, "kafka-auto-create-topics", c.envBool("kafka-auto-create-topics", "STREAMD_KAFKA_AUTO_CREATE_TOPICS", false), "create a topic (one partition) when a Kafka client produces to or asks for a missing one ($STREAMD_KAFKA_AUTO_CREATE_TOPICS)")
}

func (c *serveConfig) validateKafka() error {
	if c.kafka.producerExpiration <= 0 {
		return fmt.Errorf("--producer-id-expiration %v must be positive", c.kafka.producerExpiration)
	}
	unsecuredSet := c.kafka.oauthRequiredScope != "" || c.kafka.oauthClockSkew != 0
	if c.kafka.addr == "" {
		if c.kafka.advertisedAddr != "" || c.kafka.autoCreate || c.kafka.oauthUnsecured || unsecuredSet {
			return errors.New("--kafka-advertised-addr, --kafka-auto-create-topics and --kafka-sasl-oauthbearer-unsecured* need --kafka-addr")
		}
		return nil
	}
	if c.kafka.brokerIdentities < 1 || c.kafka.brokerIdentities > brokers.MaxSlots {
		return fmt.Errorf("--kafka-broker-identities %d must be between 1 and %d", c.kafka.brokerIdentities, brokers.MaxSlots)
	}
	host, _, err := net.SplitHostPort(c.kafka.addr)
	if err != nil {
		return fmt.Errorf("--kafka-addr %q: %v", c.kafka.addr, err)
	}
	if c.authDisabled && !loopback(host) {
		return fmt.Errorf("--kafka-addr %q is not a loopback address: with --auth-disabled the Kafka listener authenticates nobody, so it listens on 127.0.0.1 or ::1 only (give --auth-token or --auth-token-file to serve other hosts)", c.kafka.addr)
	}
	switch {
	case unsecuredSet && !c.kafka.oauthUnsecured:
		return errors.New("--kafka-sasl-oauthbearer-unsecured-required-scope and --kafka-sasl-oauthbearer-unsecured-clock-skew need --kafka-sasl-oauthbearer-unsecured")
	case !c.kafka.oauthUnsecured:
	case c.authDisabled:
		return errors.New("--kafka-sasl-oauthbearer-unsecured needs SASL, which --auth-disabled turns off: give --auth-token or --auth-token-file")
	case !loopback(host):
		return fmt.Errorf("--kafka-addr %q is not a loopback address: with --kafka-sasl-oauthbearer-unsecured any client can claim any principal, so the Kafka listener listens on 127.0.0.1 or ::1 only (it is for development)", c.kafka.addr)
	case c.kafka.oauthClockSkew < 0:
		return fmt.Errorf("--kafka-sasl-oauthbearer-unsecured-clock-skew %v must not be negative", c.kafka.oauthClockSkew)
	}
	return nil
}

// oauthUnsecuredConfig is the kafka.Config.OAuthBearerUnsecured of the flags (nil: off).
func (k *kafkaConfig) oauthUnsecuredConfig() *kafka.OAuthBearerUnsecured {
	if !k.oauthUnsecured {
		return nil
	}
	return &kafka.OAuthBearerUnsecured{
		AllowableClockSkew: k.oauthClockSkew,
		RequiredScope:      strings.FieldsFunc(k.oauthRequiredScope, func(r rune) bool { return r == ',' || r == ' ' }),
	}
}

// loopback reports whether host names a loopback interface only (an empty host
// or 0.0.0.0 listens on every interface).
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// startKafka starts the Kafka server and the wake-up listener its long polls wait
// on (goroutines owned by serve: both end when ctx ends or stop is called). stop
// ends them and waits for both. Nothing runs when --kafka-addr is empty. tokens are
// the API's principals (nil with --auth-disabled: no SASL).
func startKafka(ctx context.Context, g *globals, c *serveConfig, pool *pgxpool.Pool, reg prometheus.Registerer, tokens access.Tokens) (stop func() error, err error) {
	if c.kafka.addr == "" {
		return func() error { return nil }, nil
	}
	var tlsCfg *tls.Config
	if c.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key for the Kafka listener: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if c.authDisabled {
		tokens = nil
	}
	url, err := g.url(ctx)
	if err != nil {
		return nil, err
	}
	listener, err := wakeup.NewListener(&wakeup.ListenerConfig{ConnString: url, Logger: g.logger})
	if err != nil {
		return nil, err
	}
	srv, err := kafka.New(pool, &kafka.Config{
		AdvertisedAddr:       c.kafka.advertisedAddr,
		Addr:                 c.kafka.addr,
		AutoCreateTopics:     c.kafka.autoCreate,
		BrokerIdentities:     int(c.kafka.brokerIdentities),
		Compression:          c.kafka.compression,
		Logger:               g.logger,
		OAuthBearerUnsecured: c.kafka.oauthUnsecuredConfig(),
		Registerer:           reg,
		ShutdownTimeout:      c.shutdownTimeout,
		TLS:                  tlsCfg,
		Tokens:               tokens,
		Wakeups:              listener.Hub,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", c.kafka.addr)
	if err != nil {
		return nil, fmt.Errorf("--kafka-addr %s: %w", c.kafka.addr, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	listenerDone := make(chan error, 1)
	go func() { listenerDone <- listener.Run(ctx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ctx, ln) }()
	return func() error {
		cancel()
		return errors.Join(<-serveDone, <-listenerDone)
	}, nil
}
