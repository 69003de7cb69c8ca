package admin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"time"

	"github.com/jmoiron/sqlx"
)

// Sessions keeps sign-ins in t_admin_session, so that every replica knows
// them and a revocation holds everywhere at once.
type Sessions struct {
	DB  *sqlx.DB
	TTL time.Duration
}

// Session is a sign-in as the sessions page lists it.
type Session struct {
	ID        string    `db:"id"` // SHA-256 of the cookie: not the secret
	Operator  string    `db:"operator"`
	CreatedAt time.Time `db:"created_at"`
	ExpiresAt time.Time `db:"expires_at"`
}

func idOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Create starts a session for operator and returns the cookie's token.
func (s *Sessions) Create(ctx context.Context, operator string) (string, error) {
	b := make([]byte, 32)
	rand.Read(b)
	token := hex.EncodeToString(b)
	_, err := s.DB.ExecContext(ctx, `INSERT INTO t_admin_session (id, operator, expires_at)
		VALUES (?, ?, CURRENT_TIMESTAMP(3) + INTERVAL ? SECOND)`, idOf(token), operator, int(s.TTL.Seconds()))
	return token, err
}

// errNoSession: no such session, or it expired or was revoked.
var errNoSession = errors.New("no live session")

// Lookup returns the operator of a live session.
func (s *Sessions) Lookup(ctx context.Context, token string) (operator, id string, err error) {
	id = idOf(token)
	err = s.DB.GetContext(ctx, &operator, `SELECT operator FROM t_admin_session
		WHERE id = ? AND revoked_at IS NULL AND expires_at > CURRENT_TIMESTAMP(3)`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", id, errNoSession
	}
	return operator, id, err
}

// Revoke ends the session id (by) and reports whether it was live.
func (s *Sessions) Revoke(ctx context.Context, id, by string) (bool, error) {
	res, err := s.DB.ExecContext(ctx, `UPDATE t_admin_session SET revoked_at = CURRENT_TIMESTAMP(3), revoked_by = ?
		WHERE id = ? AND revoked_at IS NULL`, by, id)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// Live lists the sessions that have not ended, newest first.
func (s *Sessions) Live(ctx context.Context) ([]Session, error) {
	var out []Session
	err := s.DB.SelectContext(ctx, &out, `SELECT id, operator, created_at, expires_at FROM t_admin_session
		WHERE revoked_at IS NULL AND expires_at > CURRENT_TIMESTAMP(3) ORDER BY created_at DESC LIMIT 200`)
	return out, err
}
