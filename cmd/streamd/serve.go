package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
)

func newServeCmd(g *globals) *cobra.Command {
	addr := envOr("STREAMD_HTTP_ADDR", "127.0.0.1:8484")
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the coordinator daemon: migrate, then serve /healthz and /metrics",
		Long: `Connects (or starts the local development cluster), applies migrations, and
serves /healthz and /metrics over HTTP until SIGINT or SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), cmd, g, addr)
		},
	}
	cmd.Flags().StringVar(&addr, "http-addr", addr, "HTTP listen address ($STREAMD_HTTP_ADDR)")
	return cmd
}

func serve(ctx context.Context, cmd *cobra.Command, g *globals, addr string) error {
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(cmd, g, pool); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	up := prometheus.NewGauge(prometheus.GaugeOpts{Name: "streamd_up", Help: "1 while streamd serve runs."})
	up.Set(1)
	reg.MustRegister(up)

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

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s (--http-addr / STREAMD_HTTP_ADDR): %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	g.logger.Info("streamd serving", "http_addr", ln.Addr().String(), "pid", os.Getpid())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	g.logger.Info("streamd stopping")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	g.logger.Info("streamd stopped")
	return nil
}
