package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/advisory"
	"github.com/streamd/streamd/cmd/streamd/internal/api"
	"github.com/streamd/streamd/cmd/streamd/internal/coordinator"
	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/promreg"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/retention"
	schema "github.com/streamd/streamd/sql"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// serveConfig is streamd serve's configuration, from flags and environment.
type serveConfig struct {
	authDisabled    bool
	authToken       string
	authTokenFile   string
	coordinatorName string
	httpAddr        string
	kafka           kafkaConfig
	leaseTTL        time.Duration
	maxRequestBytes int64
	metricsInterval time.Duration
	reaperInterval  time.Duration
	retentionEvery  time.Duration
	retentionOnly   []string
	shutdownTimeout time.Duration
	tailer          bool
	tlsCert         string
	tlsKey          string

	// envErrs are environment values that did not parse, by the flag they set:
	// validate reports those whose flag was not given (flags win).
	envErrs map[string]error
}

func newServeCmd(g *globals) *cobra.Command {
	c := &serveConfig{envErrs: map[string]error{}}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the coordinator daemon: migrate, elect a leader, serve HTTP",
		Long: `Connects (or starts the local development cluster), applies migrations, campaigns
for the coordinator lease, and serves until SIGINT or SIGTERM:

  /healthz   the process runs and reaches the database
  /readyz    the database is reachable and migrated to this binary's schema
  /metrics   Prometheus metrics (streamd_*)
  /v1/...    the JSON admin and data API (bearer token required)

With --kafka-addr it is also a Kafka broker over the same log: clients
authenticate with SASL (PLAIN, SCRAM-SHA-256/512; username = principal, password =
one of its tokens) and are authorized per stream as the API's requests are;
--tls-cert/--tls-key make it speak TLS (SASL_SSL).

Exactly one instance (the leader) runs the coordinator jobs: retention policies
(--retention-interval), the stale-member reaper (--reaper-interval), the
consumer-lag and queue gauges (--metrics-interval), background dead-letter redrive
tasks (POST /v1/queues/{dlq}/redrive-tasks), and the WAL tailer that
re-broadcasts wake-ups to consumers and queue receivers (--tailer). Each job runs once per interval
slot across all instances. A second instance takes over
within the lease TTL of the leader dying, at once when the leader stops cleanly.

Every setting is a flag, and also an environment variable (named in each flag's
help); flags win.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.validate(cmd.Flags()); err != nil {
				return err
			}
			return serve(cmd.Context(), cmd, g, c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.httpAddr, "http-addr", envOr("STREAMD_HTTP_ADDR", "127.0.0.1:8484"), "HTTP listen address ($STREAMD_HTTP_ADDR)")
	f.StringVar(&c.authToken, "auth-token", os.Getenv("STREAMD_AUTH_TOKEN"), "bearer token of the admin principal; also its SASL password on the Kafka listener ($STREAMD_AUTH_TOKEN)")
	f.StringVar(&c.authTokenFile, "auth-token-file", os.Getenv("STREAMD_AUTH_TOKEN_FILE"), "file of 'principal token' lines: API bearer tokens, and Kafka SASL usernames and passwords ($STREAMD_AUTH_TOKEN_FILE)")
	f.BoolVar(&c.authDisabled, "auth-disabled", c.envBool("auth-disabled", "STREAMD_AUTH_DISABLED", false), "serve /v1/ without tokens and Kafka without SASL, for local development only ($STREAMD_AUTH_DISABLED=true)")
	f.StringVar(&c.tlsCert, "tls-cert", os.Getenv("STREAMD_TLS_CERT"), "TLS certificate file; serve HTTPS (and Kafka over TLS) when set ($STREAMD_TLS_CERT)")
	f.StringVar(&c.tlsKey, "tls-key", os.Getenv("STREAMD_TLS_KEY"), "TLS key file ($STREAMD_TLS_KEY)")
	f.Int64Var(&c.maxRequestBytes, "max-request-bytes", c.envInt64("max-request-bytes", "STREAMD_MAX_REQUEST_BYTES", 8<<20), "largest /v1/ request body ($STREAMD_MAX_REQUEST_BYTES)")
	f.StringVar(&c.coordinatorName, "coordinator-name", envOr("STREAMD_COORDINATOR_NAME", "streamd-coordinator"), "name of the coordinator lease; instances with the same name elect one leader ($STREAMD_COORDINATOR_NAME)")
	f.DurationVar(&c.leaseTTL, "lease-ttl", c.envDuration("lease-ttl", "STREAMD_LEASE_TTL", 5*time.Second), "coordinator lease TTL: the longest a dead leader delays its successor ($STREAMD_LEASE_TTL)")
	f.DurationVar(&c.metricsInterval, "metrics-interval", c.envDuration("metrics-interval", "STREAMD_METRICS_INTERVAL", 15*time.Second), "how often the leader refreshes the lag and queue gauges ($STREAMD_METRICS_INTERVAL)")
	f.DurationVar(&c.reaperInterval, "reaper-interval", c.envDuration("reaper-interval", "STREAMD_REAPER_INTERVAL", time.Second), "how often the leader expires stale group members ($STREAMD_REAPER_INTERVAL)")
	f.DurationVar(&c.retentionEvery, "retention-interval", c.envDuration("retention-interval", "STREAMD_RETENTION_INTERVAL", time.Minute), "how often the leader applies retention policies ($STREAMD_RETENTION_INTERVAL)")
	f.StringSliceVar(&c.retentionOnly, "retention-streams", splitEnv("STREAMD_RETENTION_STREAMS"), "apply retention to these streams only (default: every stream with an enabled policy) ($STREAMD_RETENTION_STREAMS, comma-separated)")
	f.BoolVar(&c.tailer, "tailer", c.envBool("tailer", "STREAMD_TAILER", true), "the leader tails the WAL and re-broadcasts wake-ups with pg_notify (falls back to polling by itself without wal_level=logical or replication rights) ($STREAMD_TAILER=false disables)")
	c.kafkaFlags(f)
	f.DurationVar(&c.shutdownTimeout, "shutdown-timeout", c.envDuration("shutdown-timeout", "STREAMD_SHUTDOWN_TIMEOUT", 15*time.Second), "bound on finishing in-flight requests at shutdown ($STREAMD_SHUTDOWN_TIMEOUT)")
	return cmd
}

// envInt64, envDuration and envBool read the default of flag from the environment
// variable name; a value that does not parse (all of it: "8MiB" is not 8) is kept in
// c.envErrs for validate, and the default applies.
func (c *serveConfig) envInt64(flag, name string, def int64) int64 {
	if s := os.Getenv(name); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err == nil {
			return v
		}
		c.envErrs[flag] = fmt.Errorf("$%s=%q is not an integer", name, s)
	}
	return def
}

func (c *serveConfig) envDuration(flag, name string, def time.Duration) time.Duration {
	if s := os.Getenv(name); s != "" {
		d, err := time.ParseDuration(s)
		if err == nil {
			return d
		}
		c.envErrs[flag] = fmt.Errorf("$%s=%q is not a duration (e.g. 5s)", name, s)
	}
	return def
}

func (c *serveConfig) envBool(flag, name string, def bool) bool {
	if s := os.Getenv(name); s != "" {
		v, err := strconv.ParseBool(s)
		if err == nil {
			return v
		}
		c.envErrs[flag] = fmt.Errorf("$%s=%q is not a boolean (true or false)", name, s)
	}
	return def
}

func splitEnv(name string) []string {
	return splitList(os.Getenv(name))
}

// splitList splits a comma-separated list, trimming spaces and dropping empty items;
// nil for an empty list.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (c *serveConfig) validate(flags *pflag.FlagSet) error {
	var envErrs []error
	for flag, err := range c.envErrs {
		if flags == nil || !flags.Changed(flag) {
			envErrs = append(envErrs, err)
		}
	}
	if len(envErrs) > 0 {
		slices.SortFunc(envErrs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return errors.Join(envErrs...)
	}
	if _, _, err := net.SplitHostPort(c.httpAddr); err != nil {
		return fmt.Errorf("--http-addr %q: %v", c.httpAddr, err)
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together: give both or neither")
	}
	if c.authDisabled && (c.authToken != "" || c.authTokenFile != "") {
		return errors.New("--auth-disabled contradicts --auth-token/--auth-token-file: choose one")
	}
	if !c.authDisabled && c.authToken == "" && c.authTokenFile == "" {
		return errors.New("no API token: set --auth-token ($STREAMD_AUTH_TOKEN) or --auth-token-file, or --auth-disabled for local development")
	}
	if c.maxRequestBytes <= 0 {
		return fmt.Errorf("--max-request-bytes %d must be positive", c.maxRequestBytes)
	}
	if c.leaseTTL < time.Second || c.leaseTTL > 24*time.Hour {
		return fmt.Errorf("--lease-ttl %v must be between 1s and 24h", c.leaseTTL)
	}
	if c.coordinatorName == "" {
		return errors.New("--coordinator-name must not be empty")
	}
	if c.metricsInterval <= 0 {
		return fmt.Errorf("--metrics-interval %v must be positive", c.metricsInterval)
	}
	if c.reaperInterval <= 0 {
		return fmt.Errorf("--reaper-interval %v must be positive", c.reaperInterval)
	}
	if c.retentionEvery <= 0 {
		return fmt.Errorf("--retention-interval %v must be positive", c.retentionEvery)
	}
	if c.shutdownTimeout <= 0 {
		return fmt.Errorf("--shutdown-timeout %v must be positive", c.shutdownTimeout)
	}
	return c.validateKafka()
}

// tokens returns the token → principal map from --auth-token and --auth-token-file.
func (c *serveConfig) tokens() (access.Tokens, error) {
	out := access.Tokens{}
	if c.authToken != "" {
		out[c.authToken] = api.AdminPrincipal
	}
	if c.authTokenFile == "" {
		return out, nil
	}
	f, err := os.Open(c.authTokenFile)
	if err != nil {
		return nil, fmt.Errorf("--auth-token-file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("--auth-token-file %s line %d: want 'principal token'", c.authTokenFile, n)
		}
		out[fields[1]] = fields[0]
	}
	return out, sc.Err()
}

func serve(ctx context.Context, cmd *cobra.Command, g *globals, c *serveConfig) error {
	// Every setting is checked before the database is touched: a refused setting
	// must not leave a migrated (or started) database behind.
	tokens, err := c.tokens()
	if err != nil {
		return err
	}
	apiCfg := &api.Config{AuthDisabled: c.authDisabled, Logger: g.logger, MaxRequestBytes: c.maxRequestBytes, Tokens: tokens}
	if err := apiCfg.Validate(); err != nil {
		return err
	}
	pool, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(cmd, g, pool); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	goColl, procColl := collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})
	up := prometheus.NewGauge(prometheus.GaugeOpts{Name: "streamd_up", Help: "1 while streamd serve runs."})
	up.Set(1)
	if err := errors.Join(promreg.Register(reg, &goColl), promreg.Register(reg, &procColl), promreg.Register(reg, &up)); err != nil {
		return err
	}

	apiSrv, err := api.New(pool, apiCfg)
	if err != nil {
		return err
	}
	if c.authDisabled {
		g.logger.Warn("API authentication is disabled: every request acts as admin")
	}

	// The elector renews the lease on a pool of its own: on the API's, a burst of
	// requests that took every connection made renewals time out (their budget is the
	// renew interval), and leadership, with it every job, flapped.
	electorCfg := pool.Config()
	electorCfg.MaxConns, electorCfg.MinConns = 2, 0
	electorCfg.ConnConfig.RuntimeParams["application_name"] = electorApplicationName
	electorPool, err := pgxpool.NewWithConfig(ctx, electorCfg)
	if err != nil {
		return fmt.Errorf("coordinator pool: %w", err)
	}
	defer electorPool.Close()
	// The advisories of Go-side facts (the elector's terms; the tailer falling back to
	// polling or losing its slot) go through one publisher, so that reporting never
	// blocks them. Owner: serve; it stops when serve returns.
	advisories, err := advisory.New(pool, &advisory.Config{Logger: g.logger, Registerer: reg})
	if err != nil {
		return err
	}
	advCtx, stopAdvisories := context.WithCancel(context.WithoutCancel(ctx))
	advDone := make(chan error, 1)
	go func() { advDone <- advisories.Run(advCtx) }()
	defer func() { stopAdvisories(); <-advDone }()
	elector, err := coordinator.NewElector(electorPool, &coordinator.ElectorConfig{Advisories: advisories,
		LeaseName: c.coordinatorName, LeaseTTL: c.leaseTTL, Logger: g.logger, Registerer: reg})
	if err != nil {
		return err
	}
	queues, err := messages.NewClient(pool, &messages.ClientConfig{Logger: g.logger})
	if err != nil {
		return err
	}
	fleet, err := newGauges(consumergroup.NewAdmin(pool), queues, reg)
	if err != nil {
		return err
	}
	// An empty --retention-streams (say, from an unset variable) means every stream,
	// not none: pgx would send an empty list, which matches no stream.
	retainer, err := retention.New(pool, &retention.Config{Logger: g.logger, Registerer: reg,
		Streams: splitList(strings.Join(c.retentionOnly, ","))})
	if err != nil {
		return err
	}
	services := []coordinator.Continuous{{Name: "gauges", Run: fleet.run(c.metricsInterval)},
		coordinator.Redrive(pool, g.logger, 200*time.Millisecond)}
	if c.tailer {
		// The tailer turns committed appends and sends into coalesced pg_notify wake-ups
		// for every process's shared listener (wakeup.Listener).
		url, err := g.url(ctx)
		if err != nil {
			return err
		}
		b, err := wakeup.NewBroadcaster(&wakeup.BroadcasterConfig{Advisories: advisories, ConnString: url, Logger: g.logger, Registerer: reg})
		if err != nil {
			return err
		}
		services = append(services, coordinator.Continuous{Name: "wakeup-broadcaster", Run: b.Run})
	}
	jobs, err := coordinator.NewJobs(pool, &coordinator.JobsConfig{Jobs: coordinatorJobs(pool, consumergroup.NewAdmin(pool), c, retainer),
		Logger: g.logger, Registerer: reg, Services: services})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			http.Error(w, "database unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := schema.Check(rctx, pool); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		role := "follower"
		if elector.Current() != nil {
			role = "leader"
		}
		fmt.Fprintln(w, "ready", role)
	})
	mux.Handle("/v1/", apiSrv.Handler())

	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %w", c.httpAddr, err)
	}
	// Requests' contexts end when shutdown gives up waiting for them (see below), so
	// that long polls (fetch and receive waits of up to 30 s) return instead of
	// holding the shutdown to its timeout.
	reqCtx, cancelReqs := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelReqs(nil)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return reqCtx }}
	g.logger.Info("streamd serving", "http_addr", ln.Addr().String(), "tls", c.tlsCert != "", "holder", elector.Holder(), "pid", os.Getpid())

	// Goroutines: the HTTP server and the elector (which runs the jobs while
	// leading). Both stop when ctx ends; serve waits for both.
	httpErr := make(chan error, 1)
	go func() {
		if c.tlsCert != "" {
			httpErr <- srv.ServeTLS(ln, c.tlsCert, c.tlsKey)
		} else {
			httpErr <- srv.Serve(ln)
		}
	}()
	stopKafka, err := startKafka(ctx, g, c, pool, reg, tokens)
	if err != nil {
		srv.Close()
		<-httpErr
		return err
	}
	electorCtx, stopElector := context.WithCancel(ctx)
	electorDone := make(chan error, 1)
	go func() { electorDone <- elector.Run(electorCtx, jobs.Lead) }()

	select {
	case err = <-httpErr:
		stopElector()
		<-electorDone
		return errors.Join(fmt.Errorf("http server: %w", err), stopKafka())
	case <-ctx.Done():
	}
	g.logger.Info("streamd stopping")
	// The term ended with ctx (electorCtx derives from it): the jobs stop and the
	// lease is released at once, so a successor takes over while this instance stops
	// accepting and finishes its in-flight requests. Requests still running after half
	// of --shutdown-timeout (long polls, mostly) see their context cancelled with
	// api.ErrShuttingDown, and get the rest of it to answer (503, Retry-After).
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.shutdownTimeout)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(sctx) }() // owner: serve; ends by sctx at the latest
	var shutdownErr error
	select {
	case shutdownErr = <-shut:
	case <-time.After(c.shutdownTimeout / 2):
		g.logger.Info("cancelling the requests still running (long polls)")
		cancelReqs(api.ErrShuttingDown) // they answer 503 with Retry-After
		shutdownErr = <-shut
	}
	stopElector()
	if err := <-electorDone; err != nil {
		g.logger.Warn("elector stopped with an error", "err", err)
	}
	if err := stopKafka(); err != nil {
		g.logger.Warn("kafka server stopped with an error", "err", err)
	}
	if shutdownErr != nil && !errors.Is(shutdownErr, http.ErrServerClosed) {
		return shutdownErr
	}
	g.logger.Info("streamd stopped")
	return nil
}

// coordinatorJobs are the jobs the leader runs.
// electorApplicationName names the elector's connections in pg_stat_activity.
const electorApplicationName = "streamd-coordinator-lease"

func coordinatorJobs(pool *pgxpool.Pool, groups *consumergroup.Admin, c *serveConfig, retainer *retention.Runner) []coordinator.Job {
	return []coordinator.Job{{
		Name:     c.coordinatorName + "/retention",
		Interval: c.retentionEvery,
		Run: func(ctx context.Context) error {
			_, err := retainer.RunOnce(ctx, nil)
			return err
		},
	}, {
		// lifecycle_config.archiveAfter and deleteAfter (docs/retention.md).
		Name:     c.coordinatorName + "/lifecycle",
		Interval: c.retentionEvery,
		Run: func(ctx context.Context) error {
			_, err := streamconfig.ApplyLifecycle(ctx, pool, time.Time{})
			return err
		},
	}, {
		Name:     c.coordinatorName + "/stale-member-reaper",
		Interval: c.reaperInterval,
		Run: func(ctx context.Context) error {
			_, err := groups.ExpireStaleMembers(ctx)
			return err
		},
	}, {
		// Idempotent producers' state (Kafka's producer.id.expiration.ms).
		Name:     c.coordinatorName + "/producer-expiry",
		Interval: c.retentionEvery,
		Run: func(ctx context.Context) error {
			_, err := streams.NewClient(pool, nil).ExpireProducers(ctx, c.kafka.producerExpiration, nil)
			return err
		},
	}}
}
