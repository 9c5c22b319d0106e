package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// jsonRecords checks that every non-empty line of stderr is a JSON object
// with the keys of dlock help logging's schema, and returns the records.
func jsonRecords(t *testing.T, what, stderr string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range strings.Lines(stderr) {
		line = strings.TrimRight(line, "\n")
		if strings.TrimSpace(line) == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("%s: a line of stderr is not JSON: %q\nstderr:\n%s", what, line, stderr)
			continue
		}
		ts, _ := rec["time"].(string)
		if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
			t.Errorf("%s: record without an RFC 3339 time: %q", what, line)
		}
		switch rec["level"] {
		case "DEBUG", "INFO", "WARN", "ERROR":
		default:
			t.Errorf("%s: record without a level: %q", what, line)
		}
		if m, _ := rec["msg"].(string); m == "" {
			t.Errorf("%s: record without a msg: %q", what, line)
		}
		recs = append(recs, rec)
	}
	return recs
}

// findRecord returns the first record whose msg starts with prefix.
func findRecord(recs []map[string]any, prefix string) map[string]any {
	for _, r := range recs {
		if m, _ := r["msg"].(string); strings.HasPrefix(m, prefix) {
			return r
		}
	}
	return nil
}

// jsonLog turns text lines into records, passes records through, and drops
// the "dlock CMD: " prefix into the cmd field.
func TestJSONLog(t *testing.T) {
	var out bytes.Buffer
	w, restore := setupLogging([]string{"migrate", "--log-format", "json"}, &out)
	defer restore()
	fmt.Fprint(w, "dlock migrate dsn: passwords are shown as xxxxx\n{\"time\":\"2026-11-28T17:00:00Z\",\"level\":\"ERROR\",\"msg\":\"dlock: lease lost\"}\n\ndlock: warning: evict")
	fmt.Fprint(w, "ion\nBreak it? [y/N] ")
	restore()
	recs := jsonRecords(t, "jsonLog", out.String())
	if len(recs) != 4 {
		t.Fatalf("%d records, want 4:\n%s", len(recs), out.String())
	}
	for i, want := range []struct{ msg, level string }{
		{"passwords are shown as xxxxx", "INFO"},
		{"dlock: lease lost", "ERROR"},
		{"eviction", "WARN"},
		{"Break it? [y/N] ", "INFO"},
	} {
		if recs[i]["msg"] != want.msg || recs[i]["level"] != want.level {
			t.Errorf("record %d: %v, want msg %q level %s", i, recs[i], want.msg, want.level)
		}
	}
	if recs[0]["cmd"] != "migrate" || recs[1]["cmd"] != nil {
		t.Errorf("cmd fields: %v, %v", recs[0]["cmd"], recs[1]["cmd"])
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "--log-format", "json"}, "json"},
		{[]string{"ls", "-log-format=json", "x"}, "json"},
		{[]string{"run", "k", "--", "cmd", "--log-format", "json"}, ""},
		{[]string{"run", "--log-format", "text", "k"}, "text"},
	} {
		if got := logFormatArg(c.args); got != c.want {
			t.Errorf("logFormatArg(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

// dlock help logging documents the schema.
func TestHelpLogging(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"help", "logging"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("dlock help logging: exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{"time", "level", "msg", "cmd", "key", "err", "hint", "ERROR", "WARN", "INFO"} {
		if !strings.Contains(stdout.String(), "  "+want) && !strings.Contains(stdout.String(), want+" ") {
			t.Errorf("dlock help logging does not mention %q", want)
		}
	}
	stdout.Reset()
	dispatch([]string{"help"}, &stdout, &stderr)
	if !strings.Contains(stdout.String(), "dlock help logging") {
		t.Errorf("dlock help does not point to dlock help logging")
	}
}
