package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/localpg"
	schema "github.com/streamd/streamd/sql"
)

// globals are the flags every subcommand shares.
type globals struct {
	databaseURL string
	output      string
	logFormat   string
	logLevel    string
	logger      *slog.Logger
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "streamd",
		Short: "streamd: Kafka-style streams, consumer groups and queues in PostgreSQL",
		Long: `streamd keeps streams (partitioned append-only logs), consumer groups and
visibility-timeout queues in PostgreSQL. This one binary is the coordinator daemon
(streamd serve) and the command-line tool for everything else.

Connection: --database-url, else $STREAMD_DATABASE_URL, else a private PostgreSQL
cluster that streamd starts (or reuses), one per user whatever the directory
(streamd db url says which; $STREAMD_STATE_DIR and $STREAMD_PG_PORT choose another).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return g.init(cmd.ErrOrStderr())
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL connection string (default $STREAMD_DATABASE_URL, else the local development cluster)")
	// -O, not kcat's -o: fetch and consume take -o as kcat's --offset.
	pf.StringVarP(&g.output, "output", "O", "", "output format: table or json (default: table; fetch and consume print records as JSON lines)")
	pf.StringVar(&g.logFormat, "log-format", envOr("STREAMD_LOG_FORMAT", "text"), "log format: text or json ($STREAMD_LOG_FORMAT)")
	pf.StringVar(&g.logLevel, "log-level", envOr("STREAMD_LOG_LEVEL", "info"), "log level: debug, info, warn or error ($STREAMD_LOG_LEVEL)")

	root.AddCommand(
		newServeCmd(g),
		newMigrateCmd(g),
		newDBCmd(g),
		newStreamCmd(g),
		newProduceCmd(g),
		newFetchCmd(g),
		newGroupsCmd(g),
		newConsumeCmd(g),
		newQueueCmd(g),
		newDLQCmd(g),
		newAdvisoriesCmd(g),
		newRetentionCmd(g),
		newForwardCmd(g),
		newVersionCmd(g),
	)
	root.Version = buildVersion().String()
	root.SetVersionTemplate("{{.Version}}\n")
	return root
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func (g *globals) init(stderr io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch g.logFormat {
	case "text":
		g.logger = slog.New(slog.NewTextHandler(stderr, opts))
	case "json":
		g.logger = slog.New(slog.NewJSONHandler(stderr, opts))
	default:
		return fmt.Errorf("--log-format %q: want text or json", g.logFormat)
	}
	slog.SetDefault(g.logger)
	switch g.output {
	case "", "table", "json":
	default:
		return fmt.Errorf("--output %q: want table or json", g.output)
	}
	return nil
}

// url resolves the database: the flag, then $STREAMD_DATABASE_URL, then the local
// development cluster (started if needed).
func (g *globals) url(ctx context.Context) (string, error) {
	if g.databaseURL != "" {
		return g.databaseURL, nil
	}
	return localpg.DatabaseURL(ctx, &localpg.Config{Logger: g.logger})
}

// private reports whether the commands use the private cluster (no --database-url and
// no $STREAMD_DATABASE_URL).
func (g *globals) private() bool {
	return g.databaseURL == "" && os.Getenv(localpg.EnvDatabaseURL) == ""
}

// connect opens a connection pool on the resolved database, migrated or not (for
// streamd migrate and streamd serve, which migrate it).
func (g *globals) connect(ctx context.Context) (*pgxpool.Pool, error) {
	url, err := g.url(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

// pool opens a connection pool on the resolved database. The private development
// cluster is migrated on every use (a no-op when nothing changed); any other database
// must have been migrated (streamd migrate, or streamd serve), else the error says so.
func (g *globals) pool(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := g.connect(ctx)
	if err != nil {
		return nil, err
	}
	external := !g.private()
	if external {
		// A schema older than this binary's is let through, as it always was: the
		// commands that need what it lacks fail on their own.
		if err := schema.Check(ctx, pool); errors.Is(err, schema.ErrNotMigrated) || (err != nil && !errors.Is(err, schema.ErrSchemaBehind)) {
			pool.Close()
			return nil, fmt.Errorf("connect: %w", err)
		}
	}
	if !external {
		// The development cluster follows the checkout: migrated on every use (a no-op
		// when nothing changed), not only on the first, so that a command run after a
		// pull does not meet the older schema.
		if _, err := schema.Migrate(ctx, pool); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// print writes v as indented JSON when --output json, else calls table (the default).
func (g *globals) print(w io.Writer, v any, table func(tw *tabwriter.Writer)) error {
	if g.output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

func row(tw *tabwriter.Writer, cols ...any) {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = fmt.Sprint(c)
	}
	fmt.Fprintln(tw, strings.Join(parts, "\t"))
}

// requirePositive returns an error naming the first of the flags (integers or
// durations whose defaults are positive) that was set to 0 or less. The libraries
// read 0 as "the default", so an explicit 0 would otherwise be quietly replaced.
func requirePositive(cmd *cobra.Command, names ...string) error {
	for _, name := range names {
		f := cmd.Flags().Lookup(name)
		if f == nil {
			return fmt.Errorf("internal error: no flag --%s", name)
		}
		v := f.Value.String()
		bad := false
		if d, err := time.ParseDuration(v); err == nil && f.Value.Type() == "duration" {
			bad = d <= 0
		} else if n, err := strconv.ParseFloat(v, 64); err == nil {
			bad = n <= 0
		}
		if bad {
			return fmt.Errorf("--%s %s: must be more than 0", name, v)
		}
	}
	return nil
}
