package k8s

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dlock-go/dlock/backend"
)

// info describes l, the Lease of key (nil: none). A holder that is not
// dlock's (client-go's leader election) has its holderIdentity as Owner and
// Label.
func info(key string, l *coordinationv1.Lease) backend.LockInfo {
	li := backend.LockInfo{Key: key, Waiters: -1}
	if l == nil || holder(l) == "" {
		return li
	}
	li.Held = true
	li.Token = token(l)
	if owner, ok := l.Annotations[AnnotationOwner]; ok {
		li.Owner, li.Label = owner, l.Annotations[AnnotationLabel]
	} else {
		li.Owner, li.Label = holder(l), holder(l)
	}
	if t := l.Spec.AcquireTime; t != nil {
		li.Granted = t.Time
	}
	if t, s := l.Spec.RenewTime, l.Spec.LeaseDurationSeconds; t != nil && s != nil {
		li.Expires = t.Add(time.Duration(*s) * time.Second)
	}
	return li
}

// Inspect implements backend.Inspector. Expires is the holder's renewTime
// plus its duration, by the holder's clock.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	name := d.LeaseName(key)
	if err := checkName(name); err != nil {
		return backend.LockInfo{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	l, err := d.leases.Get(rctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return info(key, nil), nil
	}
	if err != nil {
		return backend.LockInfo{}, err
	}
	return info(key, l), nil
}

// List implements backend.Inspector: the held Leases that the driver has
// granted (label LabelLock) whose keys start with prefix.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	list, err := d.leases.List(rctx, metav1.ListOptions{LabelSelector: LabelLock + "=true"})
	if err != nil {
		return nil, err
	}
	var out []backend.LockInfo
	for i := range list.Items {
		l := &list.Items[i]
		key, ok := l.Annotations[AnnotationKey]
		if !ok || !strings.HasPrefix(key, prefix) || l.Name != d.LeaseName(key) {
			continue
		}
		if li := info(key, l); li.Held {
			out = append(out, li)
		}
	}
	slices.SortFunc(out, func(a, b backend.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// Break implements backend.Breaker: an update that clears the holder,
// conditional on the version read. leaseTransitions stays.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	name := d.LeaseName(key)
	if err := checkName(name); err != nil {
		return backend.LockInfo{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	for {
		l, err := d.leases.Get(rctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return backend.LockInfo{}, fmt.Errorf("lease %s: %w", name, backend.ErrNotHeld)
		case err != nil:
			return backend.LockInfo{}, err
		case holder(l) == "":
			return backend.LockInfo{}, fmt.Errorf("lease %s: %w", name, backend.ErrNotHeld)
		}
		_, err = d.leases.Update(rctx, releasedLease(l), updateOpts)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return backend.LockInfo{}, err
		}
		return info(key, l), nil
	}
}

// Relabel implements backend.Relabeler: the label annotation and the
// holderIdentity, conditional on the holder's last write.
func (d *Driver) Relabel(ctx context.Context, g *backend.Grant, label string) error {
	h, ok := g.Data.(*hold)
	if !ok {
		return fmt.Errorf("k8s driver: grant of another driver")
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	for {
		l := h.current()
		id := identity(label, h.owner)
		l.Spec.HolderIdentity = &id
		if label != "" {
			l.Annotations[AnnotationLabel] = label
		} else {
			delete(l.Annotations, AnnotationLabel)
		}
		got, err := d.leases.Update(rctx, l, updateOpts)
		if err == nil {
			h.setLast(got)
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
		cur, gerr := d.leases.Get(rctx, h.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			return fmt.Errorf("lease %s deleted: %w", h.name, backend.ErrNotHeld)
		case gerr != nil:
			return gerr
		case !mine(cur, h):
			return fmt.Errorf("lease %s taken or released by another: %w", h.name, backend.ErrNotHeld)
		}
		h.setLast(cur)
	}
}
