package rwlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/rwlock"
)

// hooked is a wrapper whose type == cannot compare (it holds a func), as
// wrappers that add a hook often are; it forwards dlock.Unwrapper.
type hooked struct {
	dlock.Locker
	hook func()
}

func (w hooked) Unwrap() dlock.Locker { return w.Locker }

// TestNestedThroughAWrapper: under the ctx of a hold taken through a
// wrapper that forwards dlock.Unwrapper, a Lock or RLock of the same lock,
// through the same wrapper or another one of the same Locker, is refused
// with ErrNested, whatever the wrapper's type, in both layouts (it would
// wait for itself); the same name on another Locker is not nested.
func TestNestedThroughAWrapper(t *testing.T) {
	ctx := context.Background()
	for _, shared := range []bool{true, false} {
		store := memlock.NewStore()
		d := store.NewDriver()
		if !shared {
			d = exclusiveOnly{d}
		}
		l, err := dlock.New(d)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		w := hooked{Locker: l, hook: func() {}}
		m, err := rwlock.New(w, "doc")
		if err != nil {
			t.Fatal(err)
		}
		other, err := rwlock.New(hooked{Locker: l, hook: func() {}}, "doc")
		if err != nil {
			t.Fatal(err)
		}
		err = m.Read(ctx, func(fctx context.Context, _ *rwlock.Hold) error {
			bounded, cancel := context.WithTimeout(fctx, 2*time.Second)
			defer cancel()
			for name, try := range map[string]func(context.Context) (*rwlock.Hold, error){
				"Lock": m.Lock, "RLock": m.RLock, "another wrapper's Lock": other.Lock,
			} {
				if h, err := try(bounded); !errors.Is(err, rwlock.ErrNested) {
					t.Errorf("shared layout %v: %s under a read hold through a wrapper: %v, want ErrNested", shared, name, err)
					if err == nil {
						_ = h.Release(ctx)
					}
				}
			}
			l2, err := dlock.New(store.NewDriver())
			if err != nil {
				t.Fatal(err)
			}
			defer l2.Close()
			elsewhere, err := rwlock.New(hooked{Locker: l2, hook: func() {}}, "doc")
			if err != nil {
				t.Fatal(err)
			}
			h, err := elsewhere.TryRLock(bounded)
			if err != nil {
				t.Errorf("shared layout %v: TryRLock of the same name on another Locker: %v, want a read hold", shared, err)
				return nil
			}
			return h.Release(ctx)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
