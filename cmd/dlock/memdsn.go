package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"

	"github.com/dlock-go/dlock/backend"
)

// inProcessSchemes are the DSN schemes whose locks live inside one process:
// each dlock command would have locks of its own.
var inProcessSchemes = map[string]bool{"mem": true}

// errInProcess refuses an in-process backend (see checkCrossProcess).
var errInProcess = errors.New("mem:// is an in-process lock: every dlock command has its own, so it protects nothing between commands; " +
	"use a backend that processes share (redis://, etcd://, zk://, postgres://, ...)")

// allowMemUsage is the help line of --allow-mem, for the usage texts.
const allowMemUsage = `  --allow-mem    accept a mem:// DSN, for demos: the lock then lives in this
                 dlock process alone and excludes nobody else`

// addAllowMemFlag registers --allow-mem on fs and returns its value.
func addAllowMemFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("allow-mem", false, "")
}

// checkCrossProcess fails with an error matching errInProcess if dsn, or a
// DSN nested in its parameters (migrate://?from=…&to=…), names an in-process
// backend, unless *allowMem; allowMem is the subcommand's --allow-mem flag
// (addAllowMemFlag), nil if it has none. Every subcommand that locks through
// a DSN calls it after resolveDSN; its errors never contain the DSN.
func checkCrossProcess(dsn string, allowMem *bool) error {
	if allowMem != nil && *allowMem {
		return nil
	}
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return err
	}
	switch {
	case !inProcess(u, 0):
		return nil
	case allowMem != nil:
		return fmt.Errorf("%w, or --allow-mem for a demo inside one command", errInProcess)
	default:
		return errInProcess
	}
}

// inProcess reports whether u or a DSN in its query names an in-process
// scheme, looking at most maxDSNNesting levels deep.
func inProcess(u *url.URL, depth int) bool {
	if inProcessSchemes[u.Scheme] {
		return true
	}
	if depth >= maxDSNNesting {
		return false
	}
	for _, vals := range u.Query() {
		for _, v := range vals {
			if !strings.Contains(v, "://") {
				continue
			}
			if inner, err := url.Parse(v); err == nil && inProcess(inner, depth+1) {
				return true
			}
		}
	}
	return false
}

// maxDSNNesting bounds the recursion into DSNs nested in query values.
const maxDSNNesting = 4
