package wakeup_test

import (
	"log/slog"
)

func (l *lineCounter) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&l.buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
