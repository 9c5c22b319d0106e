package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock/internal/testenv"
)

// comparison is dlock check's table of several deployments: the column
// headers (the deployments) and, by row name, the cells of each row.
type comparison struct {
	columns []string
	rows    map[string][]string
}

var cellSep = regexp.MustCompile(`\s{2,}`)

// parseComparison reads the table dlock check prints for several
// deployments: a header line "TEST  DSN1  DSN2 …", then one line per row
// until a blank line; capability and latency rows come before "TEST" in the
// same layout, under the headers "CAPABILITY" and "LATENCY".
func parseComparison(t *testing.T, stdout string) comparison {
	t.Helper()
	c := comparison{rows: map[string][]string{}}
	in := false
	for l := range strings.Lines(stdout) {
		l = strings.TrimRight(l, "\n")
		cells := cellSep.Split(l, -1)
		switch {
		case cells[0] == "CAPABILITY" || cells[0] == "LATENCY" || cells[0] == "TEST":
			in = true
			if c.columns == nil {
				c.columns = cells[1:]
			} else if strings.Join(c.columns, "|") != strings.Join(cells[1:], "|") {
				t.Fatalf("the table's sections name different columns: %q, %q\n%s", c.columns, cells[1:], stdout)
			}
		case l == "":
			in = false
		case in:
			c.rows[cells[0]] = cells[1:]
		}
	}
	if c.columns == nil {
		t.Fatalf("no comparison table in the output:\n%s", stdout)
	}
	return c
}

// cell returns the cell of row in column col, or "" if there is none.
func (c comparison) cell(row string, col int) string {
	if r := c.rows[row]; col < len(r) {
		return r[col]
	}
	return ""
}

// checkReport is the JSON that dlock check -o json writes (see checkUsage).
type checkReport struct {
	Deployments []struct {
		DSN          string          `json:"dsn"`
		Result       string          `json:"result"`
		Error        string          `json:"error"`
		TimedOutIn   string          `json:"timed_out_in"`
		Capabilities map[string]any  `json:"capabilities"`
		Latency      map[string]any  `json:"latency"`
		LeftBehind   []string        `json:"left_behind"`
		Tests        []jsonTestEntry `json:"tests"`
	} `json:"deployments"`
}

type jsonTestEntry struct {
	Name    string  `json:"name"`
	Status  string  `json:"status"`
	Reason  string  `json:"reason"`
	Seconds float64 `json:"seconds"`
}

// fenceRows returns the keys of the rows of PostgreSQL's fence table
// dlock_fence, and the tables whose name starts with "dlock_fence".
func fenceRows(t *testing.T, url string) (keys, tables []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT tablename::text FROM pg_tables WHERE tablename LIKE 'dlock%' UNION ALL SELECT sequencename::text FROM pg_sequences WHERE sequencename LIKE 'dlock%'")
	if err != nil {
		t.Fatal(err)
	}
	if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb == "dlock_fence" {
			rows, err := conn.Query(ctx, "SELECT key FROM dlock_fence")
			if err != nil {
				t.Fatal(err)
			}
			if keys, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				t.Fatal(err)
			}
		}
	}
	return keys, tables
}

// etcdKeys returns every key on the etcd server at endpoint.
func etcdKeys(t *testing.T, endpoint string) []string {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

// TestCheckCompare checks three deployments of three backends in one run:
// one table with a column per deployment, the same as a page (checked in
// headless Chromium) and as JSON; the token tests run on PostgreSQL and etcd
// with the credentials given; and nothing is left behind.
func TestCheckCompare(t *testing.T) {
	t.Parallel()
	rds, pg, et := testenv.StartRedis(t), testenv.StartPostgres(t), testenv.StartEtcd(t)
	dsns := []string{rds.URL(), pg.URL(), et.URL() + "/locks"}
	dir := t.TempDir()
	html, js := filepath.Join(dir, "report.html"), filepath.Join(dir, "report.json")
	r := runCLI(t, nil, "check", "--dsn", dsns[0], "--dsn", dsns[1], "--dsn", dsns[2],
		"--run", "^(TokensIncrease|TryAcquireHeld|FIFO|ExpireEndsLease)$", "--out", html, "--out", js)
	r.expectCode(t, 0)
	c := parseComparison(t, r.stdout)
	if strings.Join(c.columns, "|") != strings.Join(dsns, "|") {
		t.Fatalf("columns %q, want the deployments %q\n%s", c.columns, dsns, r.stdout)
	}
	for _, test := range []string{"TokensIncrease", "TryAcquireHeld", "ExpireEndsLease"} {
		for i, d := range dsns {
			if got := c.cell(test, i); got != "PASS" {
				t.Errorf("%s on %s: %q, want PASS\n%s", test, d, got, r.stdout)
			}
		}
	}
	// Redis does not claim FIFO; PostgreSQL and etcd do.
	if !strings.HasPrefix(c.cell("FIFO", 0), "SKIP") || c.cell("FIFO", 1) != "PASS" || c.cell("FIFO", 2) != "PASS" {
		t.Errorf("FIFO row %q\n%s", c.rows["FIFO"], r.stdout)
	}
	if !regexp.MustCompile(`(?m)^\[\d+\] backend does not claim FIFO waiting$`).MatchString(r.stdout) {
		t.Errorf("no footnote with the FIFO skip's reason:\n%s", r.stdout)
	}
	for row, want := range map[string][]string{
		"fencing":        {"strict", "strict", "strict"},
		"fifo":           {"no", "yes", "yes"},
		"fault-tolerant": {"no", "no", "yes"},
		"loss-signal":    {"at renewal", "immediate", "immediate"},
		"token":          {"per-key counter", "per-key counter row", "create revision"},
	} {
		if got := c.rows[row]; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("row %s: %q, want %q", row, got, want)
		}
	}
	for i := range dsns {
		if !regexp.MustCompile(`^[\d.]+(ns|µs|ms|s)$`).MatchString(c.cell("acquire p50", i)) {
			t.Errorf("acquire p50 of %s: %q, want a duration\n%s", dsns[i], c.cell("acquire p50", i), r.stdout)
		}
		if !regexp.MustCompile(`^[\d.]+(ns|µs|ms|s)$`).MatchString(c.cell("hand-off p50", i)) {
			t.Errorf("hand-off p50 of %s: %q, want a duration\n%s", dsns[i], c.cell("hand-off p50", i), r.stdout)
		}
	}

	// The JSON file says the same, one object per deployment.
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep checkReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report.json: %v\n%s", err, b)
	}
	if len(rep.Deployments) != 3 {
		t.Fatalf("report.json has %d deployments, want 3\n%s", len(rep.Deployments), b)
	}
	for i, d := range rep.Deployments {
		if d.DSN != dsns[i] || d.Result != "pass" || d.Capabilities["fencing"] != "strict" || len(d.Tests) != 4 {
			t.Errorf("deployment %d: %+v", i, d)
		}
		for _, tc := range d.Tests {
			want := c.cell(tc.Name, i)
			if !strings.HasPrefix(want, strings.ToUpper(tc.Status)) || tc.Seconds < 0 {
				t.Errorf("%s on %s: JSON says %q, the table %q", tc.Name, d.DSN, tc.Status, want)
			}
			if tc.Status == "skip" && tc.Reason == "" {
				t.Errorf("%s on %s: skipped without a reason", tc.Name, d.DSN)
			}
		}
		if _, ok := d.Latency["acquire_p50_ms"].(float64); !ok {
			t.Errorf("deployment %d: latency %v", i, d.Latency)
		}
	}

	// The page shows the table.
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dsns {
		if !strings.Contains(string(page), "<th>"+d+"</th>") {
			t.Errorf("report.html has no column for %s", d)
		}
	}
	checkRenderedCheck(t, html, dsns)

	// Nothing is left: no fence rows or tables of the check on PostgreSQL,
	// no keys on etcd or Redis.
	if keys, tables := fenceRows(t, pg.URL()); len(keys) != 0 || len(tables) > 1 {
		t.Errorf("left on PostgreSQL: fence rows %q, tables %q", keys, tables)
	}
	if keys := etcdKeys(t, et.Endpoint()); len(keys) != 0 {
		t.Errorf("keys left on etcd: %q", keys)
	}
}

// TestCheckJSON: -o json prints the report on standard output, and nothing
// else there.
func TestCheckJSON(t *testing.T) {
	t.Parallel()
	rds := testenv.StartRedis(t)
	r := runCLI(t, nil, "check", "--dsn", rds.URL(), "--run", "^(TryAcquireHeld|FIFO)$", "-o", "json")
	r.expectCode(t, 0)
	var rep checkReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	if len(rep.Deployments) != 1 {
		t.Fatalf("%d deployments\n%s", len(rep.Deployments), r.stdout)
	}
	d := rep.Deployments[0]
	want := []jsonTestEntry{{Name: "TryAcquireHeld", Status: "pass"}, {Name: "FIFO", Status: "skip", Reason: "backend does not claim FIFO waiting"}}
	if d.DSN != rds.URL() || d.Result != "pass" || len(d.Tests) != 2 {
		t.Fatalf("deployment %+v", d)
	}
	for i, w := range want {
		if g := d.Tests[i]; g.Name != w.Name || g.Status != w.Status || g.Reason != w.Reason {
			t.Errorf("test %d: %+v, want %+v", i, g, w)
		}
	}
	for _, k := range []string{"token", "fencing", "fifo", "fault_tolerant", "loss_signal"} {
		if _, ok := d.Capabilities[k]; !ok {
			t.Errorf("capabilities lack %q: %v", k, d.Capabilities)
		}
	}
}

// TestCheckTimeout: --timeout ends each deployment's run with one line that
// says where it stopped, without a goroutine dump, and removes what the run
// left: fence rows on PostgreSQL, the killed holders' keys on etcd.
func TestCheckTimeout(t *testing.T) {
	t.Parallel()
	pg, et := testenv.StartPostgres(t), testenv.StartEtcd(t)
	dsns := []string{pg.URL(), et.URL()}
	r := runCLI(t, nil, "check", "--dsn", dsns[0], "--dsn", dsns[1], "--run", "^AutoRenew$", "--timeout", "5s")
	r.expectCode(t, exitFailure)
	out := r.stdout + r.stderr
	for _, d := range dsns {
		want := regexp.MustCompile(`(?m)^dlock: ` + regexp.QuoteMeta(d) + `: timed out after 5s in AutoRenew$`)
		if n := len(want.FindAllString(out, -1)); n != 1 {
			t.Errorf("%d lines match %s, want 1:\n%s", n, want, out)
		}
	}
	if strings.Contains(out, "goroutine ") || strings.Contains(out, "panic:") {
		t.Errorf("the output has a goroutine dump:\n%s", out)
	}
	if c := parseComparison(t, r.stdout); !strings.HasPrefix(c.cell("AutoRenew", 0), "FAIL") || !strings.HasPrefix(c.cell("AutoRenew", 1), "FAIL") {
		t.Errorf("AutoRenew row %q, want FAIL in both columns\n%s", c.rows["AutoRenew"], r.stdout)
	}
	if keys, tables := fenceRows(t, pg.URL()); len(keys) != 0 || len(tables) > 1 {
		t.Errorf("left on PostgreSQL: fence rows %q, tables %q", keys, tables)
	}
	if keys := etcdKeys(t, et.Endpoint()); len(keys) != 0 {
		t.Errorf("keys left on etcd: %q", keys)
	}
}

// TestCheckNotFooled: a backend whose tokens do not increase (brokentoken://,
// registered in the test build) fails TokensIncrease in its own column only.
func TestCheckNotFooled(t *testing.T) {
	t.Parallel()
	rds := testenv.StartRedis(t)
	dsns := []string{"brokentoken://notfooled", rds.URL()}
	r := runCLI(t, nil, "check", "--dsn", dsns[0], "--dsn", dsns[1], "--run", "^(TokensIncrease|TryAcquireHeld)$")
	r.expectCode(t, exitFailure)
	c := parseComparison(t, r.stdout)
	if !strings.HasPrefix(c.cell("TokensIncrease", 0), "FAIL") || c.cell("TokensIncrease", 1) != "PASS" {
		t.Errorf("TokensIncrease row %q, want FAIL, PASS\n%s", c.rows["TokensIncrease"], r.stdout)
	}
	if c.cell("TryAcquireHeld", 0) != "PASS" || c.cell("TryAcquireHeld", 1) != "PASS" {
		t.Errorf("TryAcquireHeld row %q, want PASS, PASS\n%s", c.rows["TryAcquireHeld"], r.stdout)
	}
	if !strings.Contains(r.stdout, "not above the previous grant's") {
		t.Errorf("the failure's reason is not shown:\n%s", r.stdout)
	}
}

// TestCheckPostgres: with the credentials of the DSN (here a superuser's),
// the tests that make the server forget a holder run on PostgreSQL, and the
// check leaves no fence rows or tables.
func TestCheckPostgres(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	r := runCLI(t, nil, "check", "--dsn", pg.URL(), "--run", "^(TokensIncrease|ExpireEndsLease)$")
	r.expectCode(t, 0)
	rows := checkRows(r.stdout)
	if rows["TokensIncrease"][0] != "PASS" || rows["ExpireEndsLease"][0] != "PASS" {
		t.Errorf("rows %q, want TokensIncrease and ExpireEndsLease to pass\n%s", rows, r.stdout)
	}
	if !regexp.MustCompile(`(?m)^Cleanup: dropped the check's fence table dlock_fence_check_[0-9a-f]{8}\.$`).MatchString(r.stdout) {
		t.Errorf("no cleanup line:\n%s", r.stdout)
	}
	if keys, tables := fenceRows(t, pg.URL()); len(keys) != 0 || len(tables) != 0 {
		t.Errorf("left on PostgreSQL: fence rows %q, tables %q", keys, tables)
	}
}

func TestCheckPrivilege(t *testing.T) {
	for _, c := range []struct {
		err  string
		want bool
	}{
		{"dlock: break \"k\" (postgres): end the holder's session (pid 42): ERROR: permission denied to terminate process (SQLSTATE 42501)", true},
		{"dlock: break \"k\" (etcd): delete the holders of \"k\": etcdserver: permission denied", true},
		{"dlock: break \"k\" (zookeeper): delete /dlock/k/lock-1: zk: not authenticated", true},
		{"dlock: break \"k\" (mysql): Error 1095 (HY000): You are not owner of thread 12", true},
		{"dlock: break \"k\" (postgres): key \"k\": its holder's session was busy", false},
	} {
		if got := isPrivilegeError(errors.New(c.err)); got != c.want {
			t.Errorf("isPrivilegeError(%q) = %v, want %v", c.err, got, c.want)
		}
	}
	for _, scheme := range []string{"postgres", "etcd", "zk"} {
		if want := map[string]string{"postgres": "superuser", "etcd": "root", "zk": "digest"}[scheme]; !strings.Contains(privilegeFor(scheme), want) {
			t.Errorf("privilegeFor(%q) = %q, does not name %s", scheme, privilegeFor(scheme), want)
		}
	}
}

// TestCheckSample writes docs/check-sample.html and docs/check-sample.json,
// the comparison README links to: the whole suite against Redis, PostgreSQL
// and etcd started by the test. It is a generator, not a check, and runs only
// with DLOCK_CHECK_SAMPLE=1.
func TestCheckSample(t *testing.T) {
	if os.Getenv("DLOCK_CHECK_SAMPLE") != "1" {
		t.Skip("set DLOCK_CHECK_SAMPLE=1 to regenerate docs/check-sample.{html,json}")
	}
	rds, pg, et := testenv.StartRedis(t), testenv.StartPostgres(t), testenv.StartEtcd(t)
	docs, err := filepath.Abs(filepath.Join("..", "..", "docs"))
	if err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "check", "--dsn", rds.URL(), "--dsn", pg.URL(), "--dsn", et.URL()+"/locks",
		"--out", filepath.Join(docs, "check-sample.html"), "--out", filepath.Join(docs, "check-sample.json"))
	r.expectCode(t, 0)
	t.Logf("\n%s", r.stdout)
}
