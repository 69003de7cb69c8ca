package deadletter

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/httpjson"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// Alert is the JSON body POSTed to the webhook for a dead letter.
type Alert struct {
	Text         string `json:"text"`
	DeadLetterID int64  `json:"deadLetterId"`
	OrderNo      string `json:"orderNo"`
	ErrorClass   string `json:"errorClass"`
	LastError    string `json:"lastError"`
	RetryCount   int    `json:"retryCount"`
	ParkedCount  int    `json:"parkedCount"`
	FailedAt     string `json:"failedAt"`
}

// Alerter POSTs one alert per dead letter that became NEW: per order number,
// so a storm of copies of one failed payment raises one alert, and a payment
// that fails again after a replay raises a new one. Delivery is recorded in
// the row (alerted_at), so an alert survives a restart and is retried.
type Alerter struct {
	Store    *Store
	URL      string
	Client   *http.Client
	Log      *zap.Logger
	Interval time.Duration // poll interval; Wake shortens it
	Wake     chan struct{}
	// OnFailure, if set, is told each time a round of deliveries fails (the
	// webhook refused or did not answer): paysvc_alert_webhook_failures_total.
	OnFailure func()
}

// Run delivers pending alerts until ctx ends.
func (a *Alerter) Run(ctx context.Context) {
	for {
		if err := a.SendPending(ctx); err != nil && ctx.Err() == nil {
			a.Log.Warn("alert webhook failed; will retry", zap.Error(err))
			if a.OnFailure != nil {
				a.OnFailure()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-a.Wake:
		case <-time.After(a.Interval):
		}
	}
}

// alertLease is the lease one replica's round holds: every replica runs
// an Alerter on the same rows, and without it each would post every alert
// (a round's read, post and mark are not atomic). A lease row rather than
// GET_LOCK: on a Galera cluster two replicas on two nodes would both be
// granted the named lock.
const alertLease = "paysvc.alerts"

// SendPending posts every pending alert, one replica at a time (a round
// that finds another replica's under way leaves the alerts to it). It stops
// at the first webhook that does not answer; one the webhook refuses (an
// HTTP error status) is retried next round, and the others go on.
func (a *Alerter) SendPending(ctx context.Context) error {
	pending, err := a.Store.PendingAlerts(ctx, 100)
	if err != nil || len(pending) == 0 {
		return err
	}
	ctx, release, err := sqldb.Lease(ctx, a.Store.db, alertLease, 0)
	if errors.Is(err, sqldb.ErrLocked) {
		return nil // another replica is sending them
	}
	if err != nil {
		return err
	}
	defer release()
	// From here on ctx ends if the lease is lost: the round stops before
	// another replica's may start.
	// Read again under the lock: a round that just ended marked some.
	if pending, err = a.Store.PendingAlerts(ctx, 100); err != nil {
		return err
	}
	var refused error
	for _, d := range pending {
		err := httpjson.Post(ctx, a.Client, a.URL, Alert{
			Text: fmt.Sprintf("paysvc: payment %s reached the terminal queue (%s): %s",
				d.Order(), d.ErrorClass, d.LastError),
			DeadLetterID: d.ID, OrderNo: d.Order(), ErrorClass: d.ErrorClass, LastError: d.LastError,
			RetryCount: d.RetryCount, ParkedCount: d.ParkedCount, FailedAt: d.LastFailedAt.UTC().Format(time.RFC3339),
		})
		var refusal *httpjson.StatusError
		if errors.As(err, &refusal) {
			if refused == nil {
				refused = fmt.Errorf("alert %d: webhook answered %s", d.ID, refusal.Status)
			}
			continue // this alert again next round; the others now
		}
		if err != nil {
			return fmt.Errorf("alert %d: %w", d.ID, err) // without the URL: it may hold a secret token
		}
		if err := a.Store.MarkAlerted(ctx, d); err != nil {
			return err
		}
		a.Log.Info("alert sent", zap.Int64("dead_letter_id", d.ID), zap.String("order_no", d.Order()))
	}
	return refused
}
