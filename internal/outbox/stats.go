package outbox

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/jmoiron/sqlx"
)

// Backlog is the notices not yet published.
type Backlog struct {
	Pending   int           // notices not yet published
	OldestAge time.Duration // the oldest one's age, on the database's clock; 0 when none
}

// Stats measures the backlog of t_outbox. The count and the oldest id come
// from idx_pending alone; the age is one row's, by its primary key: a
// notice's id and create_time are both taken as it is inserted, so the
// lowest pending id is the oldest pending notice.
func Stats(ctx context.Context, db *sqlx.DB) (Backlog, error) {
	var s struct {
		N      int           `db:"n"`
		Oldest sql.NullInt64 `db:"oldest"`
	}
	if err := db.GetContext(ctx, &s, "SELECT COUNT(*) AS n, MIN(id) AS oldest FROM t_outbox WHERE status = 'PENDING'"); err != nil {
		return Backlog{}, err
	}
	if !s.Oldest.Valid {
		return Backlog{Pending: s.N}, nil
	}
	var micros sql.NullInt64
	err := db.GetContext(ctx, &micros, "SELECT TIMESTAMPDIFF(MICROSECOND, create_time, NOW(3)) FROM t_outbox WHERE id = ? AND status = 'PENDING'", s.Oldest.Int64)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Backlog{Pending: s.N}, nil // published since: the next sample sees the next one
	case err != nil:
		return Backlog{}, err
	}
	return Backlog{Pending: s.N, OldestAge: max(time.Duration(micros.Int64)*time.Microsecond, 0)}, nil
}
