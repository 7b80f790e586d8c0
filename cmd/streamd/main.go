// Command streamd is the streamd coordinator daemon and command-line tool.
//
//	streamd serve            run the daemon (migrates first)
//	streamd migrate          apply the schema migrations
//	streamd db start|stop|url  manage the private development PostgreSQL
//	streamd stream ...       create, list, describe and delete streams
//	streamd produce          append stdin lines as records
//	streamd fetch            print records without a group, as kcat -C (-o, -c, -e, -f)
//	streamd consume          print records as a member of a group, as kcat -G
//	streamd groups ...       kafka-consumer-groups: describe, reset-offsets, offsets export
//
// With no --database-url and no STREAMD_DATABASE_URL, streamd starts (or reuses) a
// private PostgreSQL cluster, one per user whatever the working directory.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "streamd:", err)
		os.Exit(1)
	}
}
