// Package kafka is streamd's Kafka front door: a broker that speaks the Kafka wire
// protocol over the streamd log and consumer groups. Topics are streams, partitions
// are partitions, Kafka offsets are streamd offsets (gapless, so they mean what
// Kafka's mean). Every request and response is decoded and encoded by franz-go's
// kmsg; this package translates and calls library methods (streams, brokers,
// consumergroup, streamconfig) and holds no SQL.
//
// One file per API family (00_produce.go, 01_fetch.go, ...), each declaring a
// handler value; the table in handlers.go lists them, and ApiVersions answers from
// it. docs/kafka.md lists the supported APIs and versions.
package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/brokers"
	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// Config configures a Server. A nil *Config means the defaults. Fields are
// alphabetical.
type Config struct {
	// Addr is the address Run listens on. Defaults to 127.0.0.1:9092.
	Addr string
	// AdvertisedAddr is the host:port Metadata gives clients for this instance.
	// Defaults to the listener's address.
	AdvertisedAddr string
	// AutoCreateTopics makes Metadata (when the client allows it) and Produce create
	// a missing topic with DefaultPartitions partitions. Defaults to false: a missing
	// topic is UNKNOWN_TOPIC_OR_PARTITION.
	AutoCreateTopics bool
	// BrokerIdentities is how many brokers (node ids) this instance is in Metadata,
	// all at its advertised address; partition leadership is spread over them. Kafka
	// clients keep one fetch in flight per broker, so with one identity a client's
	// fetch reads every partition it has from this instance; with several, franz-go
	// fetches the partitions of different identities independently. Clients that
	// key brokers by address break with more than one: librdkafka 2.0.2 (kcat,
	// confluent-kafka) takes the ids for one broker whose id keeps changing and never
	// fetches (docs/kafka.md, "Brokers"). Between 1 and 64. Defaults to 1.
	BrokerIdentities int
	// BrokerTTL is how long this instance stays listed in Metadata after its last
	// heartbeat. Defaults to 10s.
	BrokerTTL time.Duration
	// Compression is the compression.type of the topics whose performance_config does
	// not set enableCompression (Kafka's broker-level compression.type): their Fetch
	// batches are compressed with it. "uncompressed", "gzip", "snappy", "lz4" or
	// "zstd"; Kafka's "producer" is refused (streamd keeps records, not the
	// producer's batches). Defaults to "uncompressed" (docs/kafka.md, "Compression").
	Compression string
	// ConsumerGroupHeartbeatInterval is how often KIP-848 group members are told to
	// heartbeat. Defaults to 5s, at most a third of ConsumerGroupSessionTimeout.
	ConsumerGroupHeartbeatInterval time.Duration
	// ConsumerGroupSessionTimeout is the session timeout of KIP-848 group members
	// (Kafka's group.consumer.session.timeout.ms). Defaults to 45s.
	ConsumerGroupSessionTimeout time.Duration
	// DefaultPartitions is the partition count of auto-created topics and of
	// CreateTopics requests that ask for the broker's default (-1). Defaults to 1.
	DefaultPartitions int32
	// Listener is the Kafka listener name this server advertises under: Metadata
	// lists the live brokers of the same listener. Defaults to Kafka's name for the
	// listener's security: "PLAINTEXT", "SSL" (TLS), "SASL_PLAINTEXT" (Tokens) or
	// "SASL_SSL" (both).
	Listener string
	// Logger receives the server's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxRequestBytes bounds one request frame; a larger one closes the connection
	// without reading it (Kafka's socket.request.max.bytes). Defaults to 100 MiB.
	MaxRequestBytes int32
	// OAuthBearerUnsecured, when set, makes SASL OAUTHBEARER accept unsecured JWTs
	// (alg "none", no signature) besides the API tokens, validated as Apache Kafka's
	// default OAUTHBEARER handler does (OAuthBearerUnsecuredValidatorCallbackHandler:
	// the principal claim, "exp", "iat", the required scope), the principal being the
	// token's principal claim. For development only: nothing is signed, so a client
	// may claim any principal, access.AdminPrincipal included. Needs Tokens (without
	// them nothing is authenticated at all). Defaults to nil: OAUTHBEARER takes the
	// API tokens only.
	OAuthBearerUnsecured *OAuthBearerUnsecured
	// Rack is the rack Metadata reports for this instance. Defaults to none.
	Rack string
	// Registerer receives the server's metrics. Defaults to nil: no metrics.
	Registerer prometheus.Registerer
	// ShutdownTimeout bounds how long Serve waits, once ctx ended, for the requests in
	// flight to finish before closing their connections. Long polls (Fetch waits)
	// end at once. Defaults to 10s.
	ShutdownTimeout time.Duration
	// TLS, when set, makes Serve speak TLS on its listener (Kafka's SSL and SASL_SSL;
	// the certificates are the caller's). Defaults to nil: plaintext.
	TLS *tls.Config
	// Tokens, when set, makes clients authenticate with SASL (PLAIN, SCRAM-SHA-256,
	// SCRAM-SHA-512) as a principal, the username, with one of its tokens as the
	// password; each request is then authorized for that principal against the
	// streams' access_control_config (access.Authorizer, docs/kafka.md "Security").
	// Before authenticating a client may send only ApiVersions, SaslHandshake and
	// SaslAuthenticate. Defaults to nil: no authentication, every client is
	// access.AdminPrincipal (bind such a listener to loopback only).
	Tokens access.Tokens
	// Wakeups, when set, ends Fetch long polls as soon as something may have been
	// committed to a stream they read (the process's wakeup.Listener's Hub, fed by
	// the tailer). Polling (5ms doubling up to 100ms; 1s with Wakeups) stays on as
	// the safety net. Defaults to nil: poll only.
	Wakeups *wakeup.Hub
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Addr == "" {
		out.Addr = "127.0.0.1:9092"
	}
	if _, _, err := net.SplitHostPort(out.Addr); err != nil {
		return out, fmt.Errorf("kafka: Config.Addr %q: %v", out.Addr, err)
	}
	if out.AdvertisedAddr != "" {
		if _, err := splitAddr(out.AdvertisedAddr); err != nil {
			return out, fmt.Errorf("kafka: Config.AdvertisedAddr: %v", err)
		}
	}
	if out.Compression == "" {
		out.Compression = compressionUncompressed
	}
	if _, ok := compressionCodecs[out.Compression]; !ok {
		return out, fmt.Errorf("kafka: Config.Compression %q is not uncompressed, gzip, snappy, lz4 or zstd "+
			"(streamd keeps records, not the producer's batches, so Kafka's \"producer\" cannot be honoured)", out.Compression)
	}
	if out.BrokerIdentities == 0 {
		out.BrokerIdentities = 1
	}
	if out.BrokerIdentities < 1 || out.BrokerIdentities > brokers.MaxSlots {
		return out, fmt.Errorf("kafka: Config.BrokerIdentities %d must be between 1 and %d", out.BrokerIdentities, brokers.MaxSlots)
	}
	if out.DefaultPartitions == 0 {
		out.DefaultPartitions = 1
	}
	if out.DefaultPartitions < 1 || out.DefaultPartitions > 10000 {
		return out, fmt.Errorf("kafka: Config.DefaultPartitions %d must be between 1 and 10000", out.DefaultPartitions)
	}
	if out.MaxRequestBytes == 0 {
		out.MaxRequestBytes = 100 << 20
	}
	if out.MaxRequestBytes < 1024 {
		return out, fmt.Errorf("kafka: Config.MaxRequestBytes %d must be at least 1024", out.MaxRequestBytes)
	}
	if out.ShutdownTimeout == 0 {
		out.ShutdownTimeout = 10 * time.Second
	}
	if out.ShutdownTimeout < 0 {
		return out, fmt.Errorf("kafka: Config.ShutdownTimeout %v must be positive", out.ShutdownTimeout)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Tokens != nil {
		if len(out.Tokens) == 0 {
			return out, errors.New("kafka: Config.Tokens is empty: no client could authenticate (nil turns authentication off)")
		}
		if err := out.Tokens.Validate(); err != nil {
			return out, fmt.Errorf("kafka: Config.Tokens: %w", err)
		}
	}
	if out.OAuthBearerUnsecured != nil {
		if out.Tokens == nil {
			return out, errors.New("kafka: Config.OAuthBearerUnsecured needs Tokens: without them clients do not authenticate at all")
		}
		o, err := out.OAuthBearerUnsecured.withDefaults()
		if err != nil {
			return out, err
		}
		out.OAuthBearerUnsecured = &o
	}
	if out.Listener == "" {
		switch {
		case out.TLS != nil && out.Tokens != nil:
			out.Listener = "SASL_SSL"
		case out.TLS != nil:
			out.Listener = "SSL"
		case out.Tokens != nil:
			out.Listener = "SASL_PLAINTEXT"
		default:
			out.Listener = "PLAINTEXT"
		}
	}
	return out, nil
}

type hostPort struct {
	host string
	port int32
}

func splitAddr(addr string) (hostPort, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return hostPort{}, fmt.Errorf("%q: %v", addr, err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil || port == 0 {
		return hostPort{}, fmt.Errorf("%q: port %q must be between 1 and 65535", addr, p)
	}
	if h == "" {
		return hostPort{}, fmt.Errorf("%q: a host is needed (clients connect to it)", addr)
	}
	return hostPort{host: h, port: int32(port)}, nil
}

// Server is a Kafka broker over one streamd database. Several Servers (in one or
// many processes) may serve the same database: each is a broker, any of them can
// lead any partition. Create it with New; Run or Serve it once.
type Server struct {
	pool    *pgxpool.Pool
	cfg     Config
	logger  *slog.Logger
	streams *streams.Client
	groups  *consumergroup.Classic
	metrics *metrics
	table   map[int16]*handler
	// auth authenticates clients (nil without Config.Tokens); authz authorizes
	// their requests.
	auth  *saslAuth
	authz *access.Authorizer

	// reg is this instance's broker row, set by Serve before it accepts.
	reg *brokers.Registration

	// fetchesWaiting counts the Fetch long polls waiting (tests wait on it).
	fetchesWaiting atomic.Int64
	// fetchPoll, when set, replaces the long poll's safety-net polling intervals
	// (tests: a poll an hour away cannot pass for a wake-up).
	fetchPoll *wakeup.PollOpts
	// fetchReadHook, when set (tests), is called before each Fetch read of a
	// partition, on the read's goroutine.
	fetchReadHook func(topic string, partition int32)
	// fetchHeadsHook, when set (tests), is called before a Fetch pass that holds
	// min.bytes reads the head rows of the reads still under way.
	fetchHeadsHook func()

	// compression caches each topic's fetch codec (fetch_compression.go).
	compression topicCompression
	// fetchReads are the Fetch partition reads under way or waiting for a slot, and
	// the head reads for the watermarks of reads still under way at an answer
	// (01_fetch.go); Serve waits for them after the connections.
	fetchReads sync.WaitGroup

	// tails are the partitions' tail readers (tail.go): started by Serve, stopped by
	// its shutdown.
	tails tailReaders

	// topicIDs caches the streams' topic ids for Fetch v13+ (01_fetch.go) and
	// DeleteTopics v6 (topicNameOf).
	topicIDs struct {
		mu    sync.Mutex
		names map[[16]byte]string
	}

	mu    sync.Mutex
	conns map[*conn]struct{}
}

// New returns a Server on pool. It fails when cfg has a bad field (the error names
// it).
func New(pool *pgxpool.Pool, cfg *Config) (*Server, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	groups, err := consumergroup.NewClassic(pool, &consumergroup.ClassicConfig{
		ConsumerHeartbeatInterval: c.ConsumerGroupHeartbeatInterval, ConsumerSessionTimeout: c.ConsumerGroupSessionTimeout})
	if err != nil {
		return nil, err
	}
	var auth *saslAuth
	if c.Tokens != nil {
		if auth, err = newSASLAuth(c.Tokens, c.OAuthBearerUnsecured); err != nil {
			return nil, err
		}
	}
	return &Server{
		pool:    pool,
		auth:    auth,
		authz:   access.NewAuthorizer(pool),
		groups:  groups,
		cfg:     c,
		logger:  c.Logger,
		streams: streams.NewClient(pool, &streams.ClientConfig{Logger: c.Logger}),
		metrics: m,
		table:   handlerTable(auth != nil),
		conns:   map[*conn]struct{}{},
	}, nil
}

// Run listens on Config.Addr and serves until ctx ends; see Serve.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("kafka listen %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve registers this instance as a broker (advertising Config.AdvertisedAddr, or
// ln's address), accepts connections on ln (with TLS when Config.TLS is set) and
// serves each on its own goroutine until ctx ends. Then it stops accepting, ends long polls, waits up to
// ShutdownTimeout for the requests in flight, closes every connection, deregisters
// the broker and returns nil. It closes ln. An error registering or accepting is
// returned after the same shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	defer ln.Close()
	if s.cfg.TLS != nil {
		// The handshake runs on each connection's first read, in its own goroutine.
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	adv := s.cfg.AdvertisedAddr
	if adv == "" {
		adv = ln.Addr().String()
	}
	hp, err := splitAddr(adv)
	if err != nil {
		return fmt.Errorf("kafka advertised address: %w", err)
	}
	reg, err := brokers.Register(ctx, s.pool, hp.host, hp.port, &brokers.Config{
		Listener: s.cfg.Listener, Logger: s.logger, Rack: s.cfg.Rack, Slots: s.cfg.BrokerIdentities, TTL: s.cfg.BrokerTTL})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.reg = reg
	s.mu.Unlock()

	// Goroutines: the broker heartbeat and the accept loop, both owned by Serve;
	// each connection's goroutines are owned by its conn (see conn.go).
	regCtx, stopReg := context.WithCancel(context.WithoutCancel(ctx))
	regDone := make(chan struct{})
	go func() {
		defer close(regDone)
		_ = reg.Run(regCtx)
	}()
	// draining ends when shutdown starts: long polls watch it and answer at once.
	draining, stopDraining := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDraining()
	s.tails.begin(ctx)
	acceptErr := make(chan error, 1)
	var wg sync.WaitGroup
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			c := s.newConn(nc, draining)
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.serve()
			}()
		}
	}()
	s.logger.Info("kafka listening", "kafka_addr", ln.Addr().String(), "advertised", adv, "node_ids", reg.NodeIDs(),
		"listener", s.cfg.Listener)
	if s.cfg.OAuthBearerUnsecured != nil {
		s.logger.Warn("kafka OAUTHBEARER accepts unsecured JWTs: any client can claim any principal (development only)",
			"kafka_addr", ln.Addr().String())
	}

	var serveErr error
	select {
	case <-ctx.Done():
		ln.Close()
		<-acceptErr // the accept loop has returned: no connection is added from here on
	case err := <-acceptErr:
		serveErr = fmt.Errorf("kafka accept: %w", err)
	}
	ln.Close()
	stopDraining()
	s.mu.Lock()
	for c := range s.conns {
		c.stopReading()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.ShutdownTimeout):
		s.mu.Lock()
		for c := range s.conns {
			c.close()
		}
		s.mu.Unlock()
		<-done
	}
	s.tails.stopAll()              // the tail readers (tail.go)
	s.fetchReads.Wait()            // the reads the connections' fetches left (they end with their connection)
	s.compression.refreshes.Wait() // the fetch codecs' refreshes (fetch_compression.go)
	stopReg()
	<-regDone
	s.logger.Info("kafka stopped", "node_ids", reg.NodeIDs())
	if serveErr != nil && ctx.Err() == nil {
		return serveErr
	}
	return nil
}

// self is this instance as a broker. Valid once Serve registered it.
func (s *Server) self() brokers.Broker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reg.Self()
}

// liveBrokers lists the live brokers by node id; this instance's identities are always
// among them, even when their rows expired (a stalled heartbeat), so that a client is
// never told there is no broker by the broker it talks to.
func (s *Server) liveBrokers(ctx context.Context) ([]brokers.Broker, error) {
	s.mu.Lock()
	reg := s.reg
	s.mu.Unlock()
	live, err := brokers.Live(ctx, s.pool, reg.Listener())
	if err != nil {
		return nil, err
	}
	added := false
	for _, me := range reg.Selves() {
		if !slices.ContainsFunc(live, func(b brokers.Broker) bool { return b.NodeID == me.NodeID }) {
			live, added = append(live, me), true
		}
	}
	if added {
		slices.SortFunc(live, func(a, b brokers.Broker) int { return cmp.Compare(a.NodeID, b.NodeID) })
	}
	return live, nil
}
