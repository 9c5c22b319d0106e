package conformance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// register is the fenced resource of a fault trial or a soak: one counter per
// key, behind a fencing.Guard, in the parent test process. Holders increment
// it as a remote client would: a fenced read, some think time, and a fenced
// write of the value read plus one. Every request is recorded for porcupine,
// which finds lost updates (two increments from the same value both accepted);
// the register also counts stale writes accepted (see op).
type register struct {
	guard fencing.Guard
	start time.Time // origin of the history's timestamps

	mu      sync.Mutex
	vals    map[string]int
	writes  map[string]int   // per key: writes accepted
	newest  map[string]int64 // per key: the latest Acquire call (wall ns) of any lease that reached the resource
	hist    []porcupine.Operation
	clients map[string]int // lease label -> porcupine client id

	accepted, rejected, stale int
	staleEvidence             []string
	rejections                []string // the first few requests rejected as stale: whose, and why
}

func newRegister() *register {
	return &register{start: time.Now(), vals: map[string]int{}, writes: map[string]int{}, newest: map[string]int64{}, clients: map[string]int{}}
}

// regInput and regOutput are porcupine's input and output of one request.
type regInput struct {
	Key   string
	Write bool
	V     int // the value written (the value read plus one)
}

type regOutput struct {
	OK bool
	V  int // the value read
}

// leaseRef names a lease for the register: a label, its token, and the wall
// times (ns) its Acquire was called and returned, which order grants of one
// key where they do not overlap.
type leaseRef struct {
	Label   string
	Token   dlock.Token
	Granted int64 // when its Acquire returned
	Called  int64 // when its Acquire was called; 0: not known, taken as Granted
}

// op performs one fenced request of lease on key's counter: a read if
// !write, else a write of v. It returns the value read and whether the Guard
// accepted the request.
//
// A request accepted from a lease whose Acquire returned before another lease
// of the same key was even asked for, once that other lease has reached the
// resource (accepted or not), is a stale write accepted: the other was
// granted after it, the resource had been told of the newer holder, and still
// let the older one in. (Two leases whose acquires overlap in time cannot be
// ordered so: a waiter's reply can come back after a later grant's, the first
// grant having been wiped meanwhile, as Redis's restart-empty does.) With tokens that increase with each grant the Guard prevents
// it; tokens that go backwards (a counter lost with a server's state) let it
// happen.
func (r *register) op(key string, lease leaseRef, write bool, v int) (int, bool) {
	call := time.Since(r.start).Nanoseconds()
	var read int
	err := r.guard.Do("register:"+key, lease.Token, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if write {
			r.vals[key] = v
			r.writes[key]++
		} else {
			read = r.vals[key]
		}
		return nil
	})
	ok := err == nil
	if err != nil && !errors.Is(err, fencing.ErrStaleToken) {
		panic(fmt.Sprintf("conformance: fencing guard: %v", err)) // no write func fails
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	newest := r.newest[key]
	if ok {
		r.accepted++
		if lease.Granted < newest {
			r.stale++
			if len(r.staleEvidence) < 5 {
				r.staleEvidence = append(r.staleEvidence, fmt.Sprintf("%s (token %d, granted %s) accepted on %q after a lease asked for at %s reached it",
					lease.Label, lease.Token, wallString(lease.Granted), key, wallString(newest)))
			}
		}
	} else {
		r.rejected++
		if len(r.rejections) < 5 {
			op := "read"
			if write {
				op = "write"
			}
			r.rejections = append(r.rejections, fmt.Sprintf("%s's %s (token %d, granted %s) on %q: %v",
				lease.Label, op, lease.Token, wallString(lease.Granted), key, err))
		}
	}
	called := lease.Called
	if called == 0 {
		called = lease.Granted
	}
	if called > newest {
		r.newest[key] = called
	}
	id, seen := r.clients[lease.Label]
	if !seen {
		id = len(r.clients)
		r.clients[lease.Label] = id
	}
	r.hist = append(r.hist, porcupine.Operation{
		ClientId: id,
		Input:    regInput{Key: key, Write: write, V: v},
		Call:     call,
		Output:   regOutput{OK: ok, V: read},
		Return:   time.Since(r.start).Nanoseconds(),
		Metadata: fmt.Sprintf("%s token %d", lease.Label, lease.Token),
	})
	return read, ok
}

// counts returns the requests accepted, rejected and the stale writes
// accepted so far, with evidence for the first few.
func (r *register) counts() (accepted, rejected, stale int, evidence []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted, r.rejected, r.stale, append([]string(nil), r.staleEvidence...)
}

// rejected returns the first few requests rejected as stale, each naming
// its lease and the token that made it stale.
func (r *register) rejectedEvidence() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.rejections...)
}

// registerModel is the sequential specification of the fenced counters: a
// read returns the current value; an accepted write of v requires the value
// to be v-1 (else an increment was lost) and sets it to v; a rejected request
// changes nothing. Histories are partitioned by key.
var registerModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(regInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return 0 },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(int), input.(regInput), output.(regOutput)
		switch {
		case !out.OK:
			return true, s
		case in.Write:
			return s == in.V-1, in.V
		default:
			return out.V == s, s
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		verdict := "ok"
		if !out.OK {
			verdict = "stale token"
		}
		if in.Write {
			return fmt.Sprintf("write(%d) -> %s", in.V, verdict)
		}
		if !out.OK {
			return "read() -> " + verdict
		}
		return fmt.Sprintf("read() -> %d", out.V)
	},
	DescribeState: func(state any) string { return fmt.Sprint(state.(int)) },
	DescribeOperationMetadata: func(info any) string {
		s, _ := info.(string)
		return s
	},
}

// porcupineTimeout bounds the linearizability check; an Unknown result is
// logged, not failed.
const porcupineTimeout = 60 * time.Second

// checkLinearizable checks the register's history with porcupine. On a
// violation it saves porcupine's HTML visualisation as an artifact (see
// artifactDir) and returns an error naming the file.
func (r *register) checkLinearizable(t testing.TB) error {
	r.mu.Lock()
	hist := append([]porcupine.Operation(nil), r.hist...)
	var lost []string
	for k, n := range r.writes {
		if r.vals[k] != n {
			lost = append(lost, fmt.Sprintf("%q is %d after %d increments accepted", k, r.vals[k], n))
		}
	}
	r.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(registerModel, hist, porcupineTimeout)
	switch {
	case res == porcupine.Ok && lost == nil:
		return nil
	case res == porcupine.Unknown && lost == nil:
		t.Logf("porcupine: no verdict on %d operations within %v (not counted as a failure)", len(hist), porcupineTimeout)
		return nil
	case res != porcupine.Illegal:
		return fmt.Errorf("lost updates: %s (porcupine: %s)", strings.Join(lost, "; "), res)
	}
	dir, err := artifactDir()
	if err != nil {
		return fmt.Errorf("register history of %d operations is not linearizable (no visualisation: %w)", len(hist), err)
	}
	path := filepath.Join(dir, "porcupine-"+sanitize(t.Name())+".html")
	if err := porcupine.VisualizePath(registerModel, info, path); err != nil {
		return fmt.Errorf("register history of %d operations is not linearizable (visualisation failed: %w)", len(hist), err)
	}
	msg := fmt.Sprintf("register history of %d operations is not linearizable", len(hist))
	if lost != nil {
		msg += "; lost updates: " + strings.Join(lost, "; ")
	}
	return fmt.Errorf("%s; visualisation: %s", msg, path)
}

// artifactDir returns the directory for test artifacts: $DLOCK_ARTIFACTS if
// set (created if missing), else a new temporary directory that outlives the
// test (t.TempDir would be removed with it).
func artifactDir() (string, error) {
	if d := os.Getenv("DLOCK_ARTIFACTS"); d != "" {
		return d, os.MkdirAll(d, 0o755)
	}
	return os.MkdirTemp("", "dlock-artifacts-")
}

func sanitize(s string) string {
	return strings.NewReplacer("/", "_", " ", "_", ":", "_").Replace(s)
}

func wallString(ns int64) string {
	if ns == 0 {
		return "never"
	}
	return time.Unix(0, ns).UTC().Format("15:04:05.000000")
}
