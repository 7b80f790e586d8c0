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
		Short: "Manage the private PostgreSQL cluster (one per user)",
		Long: `The private cluster: the machine's PostgreSQL server binaries, run with
wal_level=logical on port $STREAMD_PG_PORT (default 54329), data in
$STREAMD_STATE_DIR (default: one folder per user, the same from every directory:
$XDG_STATE_HOME/streamd, else ~/.local/state/streamd; for root
$TMPDIR/streamd-state-root). Every command uses it when neither --database-url nor
STREAMD_DATABASE_URL is set; streamd db url says which folder and port.`,
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
		Short: "Print the connection string streamd uses (and, on stderr, which private cluster)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := g.url(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), url)
			if g.private() {
				cfg, err := (&localpg.Config{}).Resolved()
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "the private cluster: state folder %s, port %d ($%s, $%s)\n",
					cfg.StateDir, cfg.Port, localpg.EnvStateDir, localpg.EnvPort)
			}
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
