package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"
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

const loggingUsage = `Logging: what dlock writes to standard error

Every command takes --log-format text (the default) or json. In text, dlock's
messages are lines such as "dlock: lost the lock "k" (redis): ..." or
"dlock ls: ...". With --log-format json, every line dlock writes to standard
error is one JSON object (log/slog's JSON format), errors included:

  time     when, RFC 3339 with fractions of a second
  level    DEBUG, INFO, WARN or ERROR
  msg      the message: the text line without its "dlock: " or
           "dlock COMMAND: " prefix; the lease's events and the drivers'
           warnings, which come from the library, keep theirs ("dlock: lease
           lost", "dlock/redis: ...")
  cmd      the command (run, ls, inspect, ...); absent on the library's
and, where they apply:
  key      the lock, semaphore or election the message is about
  err      the error, as text
  hint     where to read more (usage errors: "Run 'dlock help ls' for usage.")
  backend, token, cause, took, held, ...
           the lease's events (package dlock's WithLogger): acquired, renewed,
           renewal failed, lease lost (with its cause), released

Levels: ERROR for usage errors, failures and a lost lease; WARN for stopping
COMMAND after a loss, a failed renewal and the drivers' warnings; INFO for
the rest (progress, notes, what -v adds); DEBUG for the lease's routine
events (acquired, renewed, released; with -v). A line of a command that
gives it no level of its own is INFO.

Standard output is unaffected (tables, or JSON with -o json), and so is what
COMMAND writes itself. DSN passwords never appear, in either format.

Example:
  dlock run --log-format json nightly -- ./report.sh 2>>/var/log/dlock.jsonl
  {"time":"2026-11-28T17:04:36.18Z","level":"ERROR","msg":"dlock: lease lost","backend":"redis","key":"nightly","cause":"backend-reported",...}
  {"time":"2026-11-28T17:04:36.18Z","level":"ERROR","msg":"lost the lock \"nightly\" (redis): ...","cmd":"run","key":"nightly"}
`

// logFormatArg returns the value of the --log-format flag among a command's
// arguments (those before "--"), "" if it is not there.
func logFormatArg(args []string) string {
	format := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "log-format" {
			continue
		}
		if !hasValue && i+1 < len(args) {
			i++
			value = args[i]
		}
		format = value
	}
	return format
}

// setupLogging returns the standard error that command cmd writes to: under
// --log-format json among args, a jsonLog, with slog.Default (the drivers'
// warnings) logging to it as JSON until restore is called; otherwise stderr
// itself.
func setupLogging(args []string, stderr io.Writer) (w io.Writer, restore func()) {
	if logFormatArg(args) != "json" {
		return stderr, func() {}
	}
	cmd := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd = args[0]
	}
	jl := &jsonLog{w: stderr, cmd: cmd}
	jl.h = slog.NewJSONHandler(stderr, nil) // text lines become records here, under jl.mu
	prev := slog.Default()
	slog.SetDefault(slog.New(newOnceHandler(slog.NewJSONHandler(jl, &slog.HandlerOptions{Level: &logLevel}))))
	return jl, func() {
		jl.Flush()
		slog.SetDefault(prev)
	}
}

// jsonLog is standard error under --log-format json: it writes every line
// as one JSON object of the schema in loggingUsage. A line that is a JSON
// object already (a record of slog's JSONHandler) passes through; any other
// becomes a record at level INFO (WARN or ERROR after a "warning: " or
// "error: "), its "dlock: " or "dlock COMMAND: " prefix dropped.
type jsonLog struct {
	mu  sync.Mutex
	w   io.Writer
	h   slog.Handler // writes to w
	cmd string       // the command, for the cmd field
	buf []byte       // a line not ended yet
}

func (j *jsonLog) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.buf = append(j.buf, p...)
	for {
		i := bytes.IndexByte(j.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(j.buf[:i])
		j.buf = j.buf[i+1:]
		if err := j.line(line); err != nil {
			return len(p), err
		}
	}
}

// Flush writes what remains of an unended line (a prompt) as a record.
func (j *jsonLog) Flush() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.buf) > 0 {
		_ = j.line(string(j.buf))
		j.buf = j.buf[:0]
	}
}

func (j *jsonLog) line(line string) error {
	if strings.TrimSpace(line) == "" {
		return nil
	}
	if strings.HasPrefix(line, "{") && json.Valid([]byte(line)) {
		_, err := io.WriteString(j.w, line+"\n")
		return err
	}
	msg := line
	if m := msgPrefix.FindString(msg); m != "" {
		msg = msg[len(m):]
	}
	level := slog.LevelInfo
	switch {
	case strings.HasPrefix(msg, "error: "):
		level, msg = slog.LevelError, strings.TrimPrefix(msg, "error: ")
	case strings.HasPrefix(msg, "warning: "):
		level, msg = slog.LevelWarn, strings.TrimPrefix(msg, "warning: ")
	}
	return j.record(level, msg)
}

// msgPrefix matches the prefix of dlock's text lines: "dlock: ", "dlock ls: ",
// "dlock migrate dsn: ".
var msgPrefix = regexp.MustCompile(`^dlock(?: [a-z-]+){0,2}: `)

// record writes one record; the caller holds j.mu.
func (j *jsonLog) record(level slog.Level, msg string, attrs ...any) error {
	r := slog.NewRecord(time.Now(), level, msg, 0)
	if j.cmd != "" {
		r.AddAttrs(slog.String("cmd", j.cmd))
	}
	r.Add(attrs...)
	return j.h.Handle(context.Background(), r)
}

// logTo writes one of dlock's own messages to stderr: in text, prefix and
// msg on one line; under --log-format json, a record at level with msg (less
// an error's "dlock: ") and the key-value pairs attrs.
func logTo(stderr io.Writer, level slog.Level, prefix, msg string, attrs ...any) {
	j, ok := stderr.(*jsonLog)
	if !ok {
		fmt.Fprintln(stderr, prefix+msg)
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	_ = j.record(level, strings.TrimPrefix(msg, "dlock: "), attrs...)
}

// logError is logTo at level ERROR.
func logError(stderr io.Writer, prefix, msg string, attrs ...any) {
	logTo(stderr, slog.LevelError, prefix, msg, attrs...)
}

// jsonLogs reports whether stderr is standard error under --log-format json.
func jsonLogs(stderr io.Writer) bool {
	_, ok := stderr.(*jsonLog)
	return ok
}

// cmdLogf returns the printf of dlock run and dlock elect (cmd) about key:
// "dlock: " lines in text; under --log-format json, records whose level
// follows from the message (see logLevelOf).
func cmdLogf(stderr io.Writer, key string) func(format string, args ...any) {
	return func(format string, args ...any) {
		logTo(stderr, logLevelOf(format), "dlock: ", fmt.Sprintf(format, args...), "key", key)
	}
}

// logLevelOf returns the level of a message of dlock run by its format:
// INFO for the progress that -v adds, WARN for stopping the command and an
// unconfirmed release, ERROR for the rest (failures, a loss, a busy lock).
func logLevelOf(format string) slog.Level {
	for _, p := range []string{"acquired ", "released ", "interrupted "} {
		if strings.HasPrefix(format, p) {
			return slog.LevelInfo
		}
	}
	for _, p := range []string{"stopping the command", "the command is still running", "release of "} {
		if strings.HasPrefix(format, p) {
			return slog.LevelWarn
		}
	}
	return slog.LevelError
}

// onceHandler passes each record to its handler once: every client of a
// benchmark would repeat its driver's warnings.
type onceHandler struct {
	slog.Handler
	mu   *sync.Mutex
	seen map[string]bool
}

func newOnceHandler(h slog.Handler) *onceHandler {
	return &onceHandler{Handler: h, mu: new(sync.Mutex), seen: map[string]bool{}}
}

func (h *onceHandler) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%v %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	seen := h.seen[b.String()]
	h.seen[b.String()] = true
	h.mu.Unlock()
	if seen {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *onceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &onceHandler{Handler: h.Handler.WithAttrs(attrs), mu: h.mu, seen: h.seen}
}

func (h *onceHandler) WithGroup(name string) slog.Handler {
	return &onceHandler{Handler: h.Handler.WithGroup(name), mu: h.mu, seen: h.seen}
}
