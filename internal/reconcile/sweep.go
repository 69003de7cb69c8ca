package reconcile

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
)

// Sweeper looks for lost payments without being asked: it walks the done
// keys at Rate keys a second, a walk starting at most every Every, and
// reports the lost payments each walk found (during a walk, as it finds
// more than the last walk did). A failover that loses commits is seen
// within a walk of the keys, whether or not anyone sends the payments
// again. Each lost order is logged once while it stays lost.
type Sweeper struct {
	DB     *sqlx.DB
	Keys   DoneKeys
	Rate   int           // keys a second (0: no bound)
	Every  time.Duration // a walk starts at most this often
	Report func(lost int)
	Log    *zap.Logger
}

// maxLogged bounds the lost orders a sweeper remembers having logged; past
// it, more are counted and not logged one by one.
const maxLogged = 10000

// Run walks until ctx ends.
func (s *Sweeper) Run(ctx context.Context) {
	logged := map[string]bool{}
	last := 0
	for {
		start := time.Now()
		n, now := 0, map[string]bool{}
		err := FindLost(ctx, s.DB, s.Keys, s.Rate, func(l Lost) error {
			if n++; n > last {
				s.Report(n)
			}
			if len(now) >= maxLogged {
				return nil
			}
			now[l.OrderNo] = true
			if !logged[l.OrderNo] {
				status := l.Status
				if status == "" {
					status = "missing"
				}
				s.Log.Error("payment lost: its Redis key says done, the database does not have it (a failover or restore "+
					"lost the commit); `paysvc reconcile` lists it, `paysvc reconcile --fix` re-drives it",
					zap.String("order_no", l.OrderNo), zap.Int64("user_id", l.UserID), zap.String("amount", l.Amount.String()),
					zap.String("order_status", status))
			}
			return nil
		})
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.Log.Warn("lost-payment sweep failed; the next one starts over", zap.Error(err))
			for no := range now {
				if len(logged) < 2*maxLogged {
					logged[no] = true // logged already, in this walk
				}
			}
		default:
			s.Report(n)
			last, logged = n, now
			if n > 0 {
				s.Log.Error("lost payments found: paysvc applied them, the database does not have them "+
					"(docs/operations.md, \"Payments lost in a database failover\")",
					zap.Int("lost", n), zap.Duration("walk", time.Since(start)))
			}
		}
		if !sleep(ctx, s.Every-time.Since(start)) {
			return
		}
	}
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
