// Package dlockotel reports dlock's lease events through OpenTelemetry:
// metrics through the metric API and traces through the trace API, with the
// providers you give it or the global ones. A program without an SDK pays
// only for the API's no-op instruments.
//
//	obs, err := dlockotel.New() // the global MeterProvider and TracerProvider
//	if err != nil { ... }
//	locker, err := dlock.Open(ctx, dsn, dlock.WithObserver(obs))
//
// It records the dlock.acquire.duration, dlock.leases.held, dlock.renewals,
// dlock.renewal.duration, dlock.leases.lost, dlock.releases and
// dlock.lease.duration metrics (attribute dlock.backend), and the spans
// dlock.acquire, dlock.release, dlock.renew and dlock.lease.lost.
// docs/observability.md lists their attributes. It is a module of its own,
// so that dlock's users who do not use OpenTelemetry never download it.
package dlockotel

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/observe"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/dlock-go/dlock/dlockotel"

// Option configures New.
type Option func(*config)

type config struct {
	mp   metric.MeterProvider
	tp   trace.TracerProvider
	keys bool
}

// WithMeterProvider sets the MeterProvider. Default otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// WithTracerProvider sets the TracerProvider. Default otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithoutKeys leaves the lock's key out of spans (metrics never carry it:
// keys are unbounded). Default: spans carry dlock.key.
func WithoutKeys() Option { return func(c *config) { c.keys = false } }

// Attribute keys.
const (
	AttrBackend = attribute.Key("dlock.backend")
	AttrKey     = attribute.Key("dlock.key")
	AttrMode    = attribute.Key("dlock.mode")
	AttrOutcome = attribute.Key("dlock.outcome")
	AttrCause   = attribute.Key("dlock.cause")
	AttrEnd     = attribute.Key("dlock.end")
	AttrToken   = attribute.Key("dlock.token")
)

// observer is the observe.Observer New returns.
type observer struct {
	tracer trace.Tracer
	keys   bool
	client []trace.SpanStartOption // the span kind, boxed once

	acquireDur metric.Float64Histogram
	held       metric.Int64ObservableUpDownCounter
	renewals   metric.Int64Counter
	renewalDur metric.Float64Histogram
	lost       metric.Int64Counter
	releases   metric.Int64Counter
	leaseDur   metric.Float64Histogram

	opts sync.Map // backend → *backendOpts
}

// backendOpts are the measurement options of one backend's data points,
// built once: recording a measurement then allocates nothing for its
// attributes.
type backendOpts struct {
	backend    attribute.KeyValue
	acquire    map[string][]metric.RecordOption // mode + "/" + outcome
	held       []metric.ObserveOption
	heldN      atomic.Int64 // leases held now: read by the held counter's callback
	renewOK    []metric.AddOption
	renewErr   []metric.AddOption
	renewDur   []metric.RecordOption
	releaseOK  []metric.AddOption
	releaseErr []metric.AddOption
	lost       map[observe.LossCause][]metric.AddOption
	released   []metric.RecordOption
	lostDur    []metric.RecordOption
}

func (o *observer) optsFor(backend string) *backendOpts {
	if v, ok := o.opts.Load(backend); ok {
		return v.(*backendOpts)
	}
	be := AttrBackend.String(backend)
	set := func(kvs ...attribute.KeyValue) attribute.Set {
		return attribute.NewSet(append([]attribute.KeyValue{be}, kvs...)...)
	}
	add := func(kvs ...attribute.KeyValue) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(set(kvs...))}
	}
	rec := func(kvs ...attribute.KeyValue) []metric.RecordOption {
		return []metric.RecordOption{metric.WithAttributeSet(set(kvs...))}
	}
	b := &backendOpts{
		backend:    be,
		acquire:    map[string][]metric.RecordOption{},
		held:       []metric.ObserveOption{metric.WithAttributeSet(set())},
		renewOK:    add(AttrOutcome.String("ok")),
		renewErr:   add(AttrOutcome.String("error")),
		renewDur:   rec(),
		releaseOK:  add(AttrOutcome.String("ok")),
		releaseErr: add(AttrOutcome.String("error")),
		lost:       map[observe.LossCause][]metric.AddOption{},
		released:   rec(AttrEnd.String("released")),
		lostDur:    rec(AttrEnd.String("lost")),
	}
	for _, m := range []string{"wait", "try"} {
		for _, r := range []observe.Result{observe.ResultGranted, observe.ResultNotAcquired, observe.ResultCancelled, observe.ResultError} {
			b.acquire[m+"/"+string(r)] = rec(AttrMode.String(m), AttrOutcome.String(string(r)))
		}
	}
	for _, c := range []observe.LossCause{observe.LossRenewalFailed, observe.LossDeadlinePassed, observe.LossBackendReported} {
		b.lost[c] = add(AttrCause.String(string(c)))
	}
	v, _ := o.opts.LoadOrStore(backend, b)
	return v.(*backendOpts)
}

// New returns an observe.Observer (pass it to dlock.WithObserver) that records
// the metrics and spans of the package doc.
func New(opts ...Option) (observe.Observer, error) {
	c := config{keys: true}
	for _, o := range opts {
		o(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	m := c.mp.Meter(ScopeName)
	o := &observer{tracer: c.tp.Tracer(ScopeName), keys: c.keys,
		client: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}}
	var err error
	if o.acquireDur, err = m.Float64Histogram("dlock.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Time an Acquire or TryAcquire took, wait included.")); err != nil {
		return nil, err
	}
	// Leases held is asynchronous: an atomic count per backend, read when the
	// SDK collects, costs a grant and a release less than two recordings.
	if o.held, err = m.Int64ObservableUpDownCounter("dlock.leases.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held now."), metric.WithInt64Callback(o.observeHeld)); err != nil {
		return nil, err
	}
	if o.renewals, err = m.Int64Counter("dlock.renewals", metric.WithUnit("{renewal}"),
		metric.WithDescription("Lease renewals, by outcome.")); err != nil {
		return nil, err
	}
	if o.renewalDur, err = m.Float64Histogram("dlock.renewal.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a lease renewal took.")); err != nil {
		return nil, err
	}
	if o.lost, err = m.Int64Counter("dlock.leases.lost", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost, by cause.")); err != nil {
		return nil, err
	}
	if o.releases, err = m.Int64Counter("dlock.releases", metric.WithUnit("{release}"),
		metric.WithDescription("Releases, by outcome.")); err != nil {
		return nil, err
	}
	if o.leaseDur, err = m.Float64Histogram("dlock.lease.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a lease's grant to its end.")); err != nil {
		return nil, err
	}
	return o, nil
}

// observeHeld reports the leases held now, per backend.
func (o *observer) observeHeld(_ context.Context, obs metric.Int64Observer) error {
	o.opts.Range(func(_, v any) bool {
		b := v.(*backendOpts)
		obs.Observe(b.heldN.Load(), b.held...)
		return true
	})
	return nil
}

func mode(wait bool) string {
	if wait {
		return "wait"
	}
	return "try"
}

func (o *observer) StartAcquire(ctx context.Context, a observe.AcquireInfo) (context.Context, func(observe.AcquireOutcome) observe.LeaseObserver) {
	bo := o.optsFor(a.Backend)
	m := mode(a.Wait)
	attrs := make([]attribute.KeyValue, 2, 3) // one allocation, the key's room included
	attrs[0], attrs[1] = bo.backend, AttrMode.String(m)
	if o.keys {
		attrs = append(attrs, AttrKey.String(a.Key))
	}
	ctx, span := o.tracer.Start(ctx, "dlock.acquire", trace.WithAttributes(attrs...), o.client[0])
	return ctx, func(out observe.AcquireOutcome) observe.LeaseObserver {
		o.acquireDur.Record(ctx, out.Took.Seconds(), bo.acquire[m+"/"+string(out.Result)]...)
		if span.IsRecording() {
			if out.Result == observe.ResultGranted {
				span.SetAttributes(AttrOutcome.String(string(out.Result)), AttrToken.Int64(int64(out.Token)))
			} else {
				span.SetAttributes(AttrOutcome.String(string(out.Result)))
			}
			if out.Result == observe.ResultError {
				span.RecordError(out.Err)
				span.SetStatus(codes.Error, "acquire failed")
			}
		}
		span.End()
		if out.Result != observe.ResultGranted {
			return nil
		}
		bo.heldN.Add(1)
		// Renewals and a loss go into the acquire's trace, under its span
		// (if it has one: a no-op tracer's span context is invalid).
		l := &lease{o: o, bo: bo, key: a.Key, token: int64(out.Token), ctx: context.Background()}
		if sc := span.SpanContext(); sc.IsValid() {
			l.ctx = trace.ContextWithSpanContext(l.ctx, sc)
		}
		return l
	}
}

// lease observes one lease.
type lease struct {
	o     *observer
	bo    *backendOpts
	key   string
	token int64
	ctx   context.Context // carries the acquire's span context
}

// attrs are the attributes of the lease's renewal and loss spans.
func (l *lease) attrs() []attribute.KeyValue {
	kvs := []attribute.KeyValue{l.bo.backend, AttrToken.Int64(l.token)}
	if l.o.keys {
		kvs = append(kvs, AttrKey.String(l.key))
	}
	return kvs
}

func (l *lease) Renewed(took time.Duration, err error) {
	end := time.Now()
	_, span := l.o.tracer.Start(l.ctx, "dlock.renew", trace.WithTimestamp(end.Add(-took)), l.o.client[0])
	if err != nil {
		if span.IsRecording() {
			span.SetAttributes(append(l.attrs(), AttrOutcome.String("error"))...)
			span.RecordError(err)
			span.SetStatus(codes.Error, "renewal failed")
		}
		l.o.renewals.Add(l.ctx, 1, l.bo.renewErr...)
	} else {
		if span.IsRecording() {
			span.SetAttributes(append(l.attrs(), AttrOutcome.String("ok"))...)
		}
		l.o.renewals.Add(l.ctx, 1, l.bo.renewOK...)
	}
	span.End(trace.WithTimestamp(end))
	l.o.renewalDur.Record(l.ctx, took.Seconds(), l.bo.renewDur...)
}

func (l *lease) StartRelease(ctx context.Context) (context.Context, func(error)) {
	ctx, span := l.o.tracer.Start(ctx, "dlock.release", l.o.client...)
	return ctx, func(err error) {
		outcome := "ok"
		if err != nil {
			outcome = "error"
			span.RecordError(err)
			span.SetStatus(codes.Error, "release failed")
			l.o.releases.Add(l.ctx, 1, l.bo.releaseErr...)
		} else {
			l.o.releases.Add(l.ctx, 1, l.bo.releaseOK...)
		}
		if span.IsRecording() {
			span.SetAttributes(l.bo.backend, AttrOutcome.String(outcome), AttrToken.Int64(l.token))
		}
		span.End()
	}
}

func (l *lease) Ended(e observe.LeaseEnd) {
	dur := l.bo.released
	if e.Lost {
		dur = l.bo.lostDur
		l.o.lost.Add(l.ctx, 1, l.bo.lost[e.Cause]...)
		_, span := l.o.tracer.Start(l.ctx, "dlock.lease.lost")
		if span.IsRecording() {
			span.SetAttributes(append(l.attrs(), AttrEnd.String("lost"), AttrCause.String(string(e.Cause)))...)
			span.AddEvent("lost", trace.WithAttributes(AttrCause.String(string(e.Cause))))
			if e.Err != nil {
				span.RecordError(e.Err)
			}
			span.SetStatus(codes.Error, "lease lost")
		}
		span.End()
	}
	l.bo.heldN.Add(-1)
	l.o.leaseDur.Record(l.ctx, e.Held.Seconds(), dur...)
}

// RejectionCounter returns a function for the OnReject of fencing.Guard and
// SQLGuard that counts each rejected stale token in the counter
// dlock.fencing.rejections, without attributes; only WithMeterProvider applies.
func RejectionCounter(opts ...Option) (func(*fencing.StaleTokenError), error) {
	c := config{}
	for _, o := range opts {
		o(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	n, err := c.mp.Meter(ScopeName).Int64Counter("dlock.fencing.rejections", metric.WithUnit("{write}"),
		metric.WithDescription("Writes a fencing guard rejected for a stale token."))
	if err != nil {
		return nil, err
	}
	return func(*fencing.StaleTokenError) { n.Add(context.Background(), 1) }, nil
}
