package main

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/localpg"
	schema "github.com/streamd/streamd/sql"
)

func newDBCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "db",
		Short: "Manage the private development PostgreSQL cluster (.state/pg)",
		Long: `The private development cluster: the machine's PostgreSQL server binaries, run
with wal_level=logical on port $STREAMD_PG_PORT (default 54329), data in
$STREAMD_STATE_DIR (default .state in the project). make run and make test use it
when STREAMD_DATABASE_URL is not set.`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "start",
		Short: "Start the cluster (creating it if needed) and create the streamd database",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := localpg.DatabaseURL(cmd.Context(), &localpg.Config{Logger: g.logger})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), url)
			return nil
		},
	}, &cobra.Command{
		Use:   "stop",
		Short: "Stop the cluster (keeps its data)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localpg.Stop(cmd.Context(), &localpg.Config{Logger: g.logger})
		},
	}, &cobra.Command{
		Use:   "url",
		Short: "Print the connection string streamd uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := g.url(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), url)
			return nil
		},
	})
	return cmd
}

func newMigrateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply the schema migrations, then (re)create functions and views",
		Long: `Applies each versioned migration once, then re-creates the SQL functions and
views whose text changed. Safe to run twice, or twice at the same time.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			return migrate(cmd, g, pool)
		},
	}
}

func migrate(cmd *cobra.Command, g *globals, pool *pgxpool.Pool) error {
	res, err := schema.Migrate(cmd.Context(), pool)
	if err != nil {
		return err
	}
	if res.NewerSchema {
		g.logger.Warn("the database was migrated by a newer streamd: its functions and views are kept; upgrade this binary")
	}
	g.logger.Info("migrated", "applied", res.Applied, "objects_updated", res.ObjectsUpdated)
	return nil
}
