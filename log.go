package dlock

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/observe"
)

// WithLogger logs the Locker's lease events to logger (docs/observability.md),
// never a password. Default none: dlock logs nothing.
func WithLogger(logger *slog.Logger) Option {
	return lockerOption(func(s *settings) { s.logger = logger })
}

// WithLogKeys says whether WithLogger's records carry the key. Default true.
func WithLogKeys(on bool) Option {
	return lockerOption(func(s *settings) { s.logKeys = on })
}

// slogObserver is the observe.Observer of WithLogger.
type slogObserver struct {
	log  *slog.Logger
	keys bool
}

func (o *slogObserver) attrs(backend, key string, tok uint64) []slog.Attr {
	as := make([]slog.Attr, 0, 4)
	as = append(as, slog.String("backend", backend))
	if o.keys {
		as = append(as, slog.String("key", key))
	}
	if tok != 0 {
		as = append(as, slog.Uint64("token", tok))
	}
	return as
}

// errAttr is err as an attribute; without the key when keys are off (a
// dlock error names its key).
func (o *slogObserver) errAttr(err error) slog.Attr {
	var e *Error
	if !o.keys && errors.As(err, &e) && e.Key != "" {
		return slog.String("err", strings.ReplaceAll(err.Error(), strconv.Quote(e.Key), `"…"`))
	}
	return slog.Any("err", err)
}

func (o *slogObserver) StartAcquire(ctx context.Context, a observe.AcquireInfo) (context.Context, func(observe.AcquireOutcome) observe.LeaseObserver) {
	return ctx, func(out observe.AcquireOutcome) observe.LeaseObserver {
		as := o.attrs(a.Backend, a.Key, out.Token)
		as = append(as, slog.Bool("wait", a.Wait), slog.Duration("took", out.Took))
		switch out.Result {
		case observe.ResultGranted:
			o.log.LogAttrs(ctx, slog.LevelDebug, "dlock: acquired", as...)
			return &slogLease{o: o, ctx: context.WithoutCancel(ctx), as: o.attrs(a.Backend, a.Key, out.Token)}
		case observe.ResultError:
			o.log.LogAttrs(ctx, slog.LevelWarn, "dlock: acquire failed", append(as, o.errAttr(out.Err))...)
		default:
			o.log.LogAttrs(ctx, slog.LevelDebug, "dlock: not acquired", append(as, slog.String("result", string(out.Result)))...)
		}
		return nil
	}
}

// slogLease logs one lease's events.
type slogLease struct {
	o   *slogObserver
	ctx context.Context // the acquire's, without its cancellation (for handlers that read it)
	as  []slog.Attr
}

func (l *slogLease) Renewed(took time.Duration, err error) {
	if err != nil {
		l.o.log.LogAttrs(l.ctx, slog.LevelWarn, "dlock: renewal failed", append(l.as, slog.Duration("took", took), l.o.errAttr(err))...)
		return
	}
	l.o.log.LogAttrs(l.ctx, slog.LevelDebug, "dlock: renewed", append(l.as, slog.Duration("took", took))...)
}

func (l *slogLease) StartRelease(ctx context.Context) (context.Context, func(error)) {
	return ctx, func(err error) {
		if err != nil {
			l.o.log.LogAttrs(ctx, slog.LevelWarn, "dlock: release failed", append(l.as, l.o.errAttr(err))...)
		}
	}
}

func (l *slogLease) Ended(e observe.LeaseEnd) {
	as := append(l.as, slog.Duration("held", e.Held))
	if e.Lost {
		l.o.log.LogAttrs(l.ctx, slog.LevelError, "dlock: lease lost", append(as, slog.String("cause", string(e.Cause)), l.o.errAttr(e.Err))...)
		return
	}
	l.o.log.LogAttrs(l.ctx, slog.LevelDebug, "dlock: released", as...)
}
