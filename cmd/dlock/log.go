package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// logLevel is the lowest level of the drivers' log records that dlock
// shows: warnings by default, everything with -v.
var logLevel slog.LevelVar

func init() { logLevel.Set(slog.LevelWarn) }

// lineHandler is the slog handler of the dlock command. Drivers log through
// slog.Default (the Redis driver, for one, warns about a server
// configuration that can lose locks); dlock prints each record on one line,
// "dlock: MESSAGE (key=value, ...)", or hands it to a collector.
type lineHandler struct {
	level slog.Leveler
	out   func(line string)
	attrs []slog.Attr
}

// newLineHandler returns a handler that writes lines to w, each line once
// (every client of a benchmark would repeat its driver's warnings).
func newLineHandler(w io.Writer, level slog.Leveler) *lineHandler {
	var mu sync.Mutex
	seen := map[string]bool{}
	return &lineHandler{level: level, out: func(line string) {
		mu.Lock()
		defer mu.Unlock()
		if !seen[line] {
			seen[line] = true
			fmt.Fprintln(w, line)
		}
	}}
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	msg, lib := strings.CutPrefix(r.Message, "dlock: ") // the library's own events
	if lib || !strings.HasPrefix(msg, "dlock") {
		b.WriteString("dlock: ")
	}
	switch {
	case r.Level >= slog.LevelError:
		b.WriteString("error: ")
	case r.Level >= slog.LevelWarn:
		b.WriteString("warning: ")
	}
	b.WriteString(msg)
	attrs := append([]slog.Attr(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, a)
		return true
	})
	for i, a := range attrs {
		if i == 0 {
			b.WriteString(" (")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%v", a.Key, a.Value)
	}
	if len(attrs) > 0 {
		b.WriteString(")")
	}
	h.out(b.String())
	return nil
}

func (h *lineHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	return &c
}

// WithGroup ignores groups: no driver uses them, and the lines stay short.
func (h *lineHandler) WithGroup(string) slog.Handler { return h }

// collectLogs sends the drivers' log records of every level to a slice
// until the returned function is called, which restores the previous
// default logger and returns the lines.
func collectLogs() (stop func() []string) {
	prev := slog.Default()
	var mu sync.Mutex
	var lines []string
	var all slog.LevelVar
	all.Set(slog.LevelDebug)
	slog.SetDefault(slog.New(&lineHandler{level: &all, out: func(line string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, line)
	}}))
	return func() []string {
		slog.SetDefault(prev)
		mu.Lock()
		defer mu.Unlock()
		return lines
	}
}
