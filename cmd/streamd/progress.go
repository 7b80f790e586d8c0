package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"
)

// progress reports a long operation's progress: on a terminal, one line rewritten in
// place; otherwise a log line at most every interval (and the last one).
type progress struct {
	w        io.Writer
	tty      bool
	logger   *slog.Logger
	what     string
	interval time.Duration
	last     time.Time
}

func newProgress(w io.Writer, logger *slog.Logger, what string) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &progress{w: w, tty: tty, logger: logger, what: what, interval: 5 * time.Second}
}

// update reports done of total (total 0: unknown); final says it is the last.
func (p *progress) update(done, total int, final bool, attrs ...any) {
	if p.tty {
		if total > 0 {
			fmt.Fprintf(p.w, "\r%s: %d of %d", p.what, done, total)
		} else {
			fmt.Fprintf(p.w, "\r%s: %d", p.what, done)
		}
		if final {
			fmt.Fprintln(p.w)
		}
		return
	}
	if !final && time.Since(p.last) < p.interval {
		return
	}
	p.last = time.Now()
	p.logger.Info(p.what, append([]any{"done", done, "total", total}, attrs...)...)
}
